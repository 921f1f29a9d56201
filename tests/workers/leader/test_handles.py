"""Handle all-or-none across shards (#5044): a handle's IPs go together, or not at all."""

from __future__ import annotations

import time

from lab.cluster.objects import pod_object, put_pod
from shared.keys import REDECIDE_AFTER_SECONDS
from shared.shard import shard_of
from tests.fixtures.leader import GRACE, Env
from workers.leader.audit import Result

NODE_1, NODE_2 = "node-1", "node-2"


def _pod_across_two_nodes(env: Env) -> tuple[str, list[str]]:
    """One handle, two IPs whose `node` attributes differ (so they live on two shards): the IPv6 was
    written with the node the pod ran on before (a stale attribute), as after a KubeVirt migration."""
    sim = env.sim
    handle = "k8s-pod-network.5c1e0000000000000000000000000000000000000000000000000000000000aa"
    attrs = {"namespace": "ns", "pod": "web-0"}
    v4 = sim.cni.assign(NODE_1, handle, {**attrs, "node": NODE_1}, version=4)
    v6 = sim.cni.assign(NODE_2, handle, {**attrs, "node": NODE_2}, version=6)
    now = time.time()
    for ip in (v4, v6):
        sim.truth.allocated(ip, handle, "ns/web-0", now)
    put_pod(env.server.store, pod_object("ns", "web-0", NODE_1, [v4, v6]))
    return handle, [v4, v6]


def test_a_handle_spanning_two_shards_is_released_only_once_both_are_decided(env: Env) -> None:
    assert shard_of(NODE_1) != shard_of(NODE_2)
    sim = env.sim
    sim.add_node(NODE_1)
    sim.add_node(NODE_2)
    handle, (v4, v6) = _pod_across_two_nodes(env)
    env.decide()
    lead = env.leader()

    env.server.store.delete("pods", "ns", "web-0", grace_period_seconds=0)  # no CNI DEL: both IPs leak
    for ip in (v4, v6):
        sim.truth.stop_using(ip, time.time())
    env.decide()
    env.clock.advance(GRACE + 1)
    env.sync()
    assert env.validate([shard_of(NODE_1)]) == 1  # only the IPv4's shard has run

    lead.step()
    [held] = env.audit()
    assert (held.result, held.ip, held.handle) == (Result.HELD_BY_HANDLE, v4, handle)
    assert f"{handle}/{v6}" in held.reason
    assert env.writes() == []
    assert env.pending() == 1  # not acked: it waits for its sibling
    lead.step()
    assert len(env.audit()) == 1  # waiting is recorded once, and nothing spins

    assert env.validate([shard_of(NODE_2)]) == 1
    lead.step()
    results = {r.ip: r.result for r in env.audit()[1:]}
    assert results == {v4: Result.RELEASED, v6: Result.RELEASED}
    assert sim.truth.violations == [] and sim.truth.leaked_ips() == set()
    assert env.consistent() == []
    assert env.pending() == 0


def test_a_handle_with_a_valid_ip_is_never_released(env: Env) -> None:
    sim = env.sim
    sim.add_node(NODE_1)
    v4, v6 = sim.dual_stack_single_status("ns", "ds", NODE_1)  # #5044: status lists only the IPv4
    env.decide()
    lead = env.leader(hold_recheck_seconds=5.0)
    env.clock.advance(GRACE + 1)
    assert env.decide() == 1  # the IPv6 looks leaked; its handle's IPv4 is valid
    lead.step()
    [held] = env.audit()
    assert (held.result, held.ip) == (Result.HELD_BY_HANDLE, v6)
    # Looked at again every few seconds, recorded once, dropped after the worker's re-decide period …
    for _ in range(3):
        env.clock.advance(5.0)
        lead.step()
    assert len(env.audit()) == 1 and env.pending() == 1
    env.clock.advance(REDECIDE_AFTER_SECONDS)
    lead.step()
    assert env.audit()[-1].result is Result.HELD_BY_HANDLE
    assert "held too long" in env.audit()[-1].reason
    assert env.pending() == 0
    # … and the worker, still seeing the leak, decides again: held again, never released.
    env.sync()
    assert env.validate() == 0  # due again after the recheck period (the leader cleared its mark) …
    env.clock.advance(5.1)
    assert env.validate() == 1  # … and decided again then, without waiting for a resync
    lead.step()
    assert env.audit()[-1].result is Result.HELD_BY_HANDLE
    assert env.writes() == []
    assert sim.truth.violations == []
    assert {v4, v6} <= sim.truth.in_use_ips()
