"""The leader releases every injected leak, and nothing the ground truth says is in use.

Each test builds a cluster through the simulated CNI, lets the watcher (a relist into the mirror) and the
shard jobs (in-process, fake clock) see it, injects leaks, and steps a leader that talks to the simulated
API server over HTTP with the official client.

This module: the injected leaks, the live re-check, sequence-number conflicts and a recreated node's
tunnel IP; the rate limits are test_release_rate.py, blocks and handles written meanwhile
test_release_writes.py.
"""

from __future__ import annotations

from shared.audit import audit as audit_inventory
from shared.netaddr import cidr_to_name
from shared.verdicts import Release
from tests.fixtures.leader import GRACE, Env
from tests.workers.leader.release_helpers import _exists
from workers.leader.audit import Result


def _cluster(env: Env) -> None:
    sim = env.sim
    for n in ("node-a", "node-b", "node-c", "node-dead"):
        sim.add_node(n)
    sim.create_pod("ns", "gone", "node-a")
    sim.create_pod("ns", "moved", "node-b", dual_stack=True)
    sim.create_pod("ns", "job", "node-c")
    sim.create_pod("ns", "keep", "node-a", dual_stack=True)
    sim.create_pod("ns", "dead-1", "node-dead")
    sim.create_pod("ns", "dead-2", "node-dead", dual_stack=True)
    # look-alikes that must stay: a stale `node` attribute (#12257), a Windows node's reserved ordinals
    sim.stale_node_attribute("ns", "stale", node="node-b", attr_node="node-c")
    sim.windows_node("win-1")
    sim.create_pod("ns", "on-win", "win-1")


def test_every_injected_leak_is_released_and_nothing_in_use_is(env: Env) -> None:
    sim = env.sim
    _cluster(env)
    extra_block = sim.empty_block("node-c")  # an empty affine block of a live node with another block
    assert env.decide() == 0
    lead = env.leader()
    lead.step()
    assert env.writes() == []  # nothing to do yet: every allocation is in use

    injected = set(sim.leak_pod_deleted_without_cni_del("ns", "gone"))
    injected |= set(sim.leak_ip_changed("ns", "moved"))
    injected |= set(sim.leak_terminal_pod("ns", "job"))
    sim.leak_node_deleted("node-dead")  # its pod IPs and its tunnel IP
    leaked = sim.truth.leaked_ips()
    assert injected < leaked and len(leaked) == len(injected) + 4
    dead_blocks = sim.cni.node_blocks("node-dead", 4) + sim.cni.node_blocks("node-dead", 6)
    assert len(dead_blocks) == 2

    # The node is gone: its leaks are confirmed at once and released in the same pass as its affinities.
    assert env.decide() > 0
    lead.step()
    assert not any(_exists(env, "ipamblocks", cidr_to_name(c)) for c in dead_blocks)
    affinities = env.server.store.list("blockaffinities")["items"]
    assert not [a for a in affinities if a["spec"]["node"] == "node-dead"]
    assert {r.ip for r in env.audit() if r.result is Result.RELEASED and r.ip} == leaked - injected

    # The live nodes' leaks wait for the grace period; so does the empty block (two observations).
    env.sync()
    env.clock.advance(GRACE + 1)
    assert env.decide() > 0
    lead.step()
    env.sync()
    env.validate()
    lead.step()

    assert sim.truth.violations == []
    assert sim.truth.leaked_ips() == set()
    assert not _exists(env, "ipamblocks", cidr_to_name(extra_block))
    assert env.consistent() == []
    report = audit_inventory(env.inventory(), GRACE)
    assert report.summary["leaked"] == 0
    assert all(b.release is Release.NEVER for b in report.empty_blocks)
    released = {r.ip for r in env.audit() if r.result is Result.RELEASED and r.ip}
    assert released == leaked
    assert lead.stats.refused_valid == lead.stats.refused_conflict == lead.stats.errors == 0
    assert env.pending() == 0  # every decision acked


def test_live_recheck_refuses_a_decision_whose_pod_reappeared(env: Env) -> None:
    sim = env.sim
    sim.add_node("node-a")
    ips = sim.create_pod("ns", "web-0", "node-a")
    env.decide()
    lead = env.leader()
    sim.leak_pod_deleted_without_cni_del("ns", "web-0")
    env.decide()
    env.clock.advance(GRACE + 1)
    assert env.decide() == 1
    # Before the leader gets to it, the pod is back with the same IP (a restart race, §8.3).
    from lab.cluster.objects import pod_object, put_pod

    put_pod(env.server.store, pod_object("ns", "web-0", "node-a", ips))
    lead.step()
    [rec] = env.audit()
    assert (rec.result, rec.ip, rec.reason) == (Result.REFUSED_VALID, ips[0], "pod-running")
    assert rec.evidence["recheck"]["pod_source"] == "live"
    assert rec.evidence["decision"]["pod"] == {"lookup": "missing"}
    assert env.writes() == []
    assert env.pending() == 0  # dropped, not retried
    lead.step()
    assert len(env.audit()) == 1


def test_sequence_number_conflict_is_dropped_and_the_new_owner_keeps_its_ip(env: Env) -> None:
    # /30 blocks: a node's block is full with its tunnel IP and three pods, so a freed IP is re-used next.
    sim = env.use_pools([("10.9.0.0/24", 30)])
    sim.add_node("node-a")
    for i in range(3):
        sim.create_pod("ns", f"p{i}", "node-a")
    env.decide()
    lead = env.leader()
    handle, _ = sim.pod_handles[("ns", "p0")]
    [ip] = sim.leak_pod_deleted_without_cni_del("ns", "p0")
    env.decide()
    env.clock.advance(GRACE + 1)
    assert env.decide() == 1
    # Between the decision and the release, the IP is freed (a late CNI DEL) and re-allocated.
    sim.truth.cni_freeing([ip], True)
    assert sim.cni.release_ips(handle, [ip]) == [ip]
    sim.truth.cni_freeing([ip], False)
    assert sim.create_pod("ns", "new-owner", "node-a") == [ip]
    env.server.clear_requests()

    lead.step()
    [rec] = env.audit()
    assert (rec.result, rec.ip) == (Result.REFUSED_CONFLICT, ip)
    assert "bad sequence number" in rec.reason
    assert env.writes() == []
    assert env.pending() == 0
    # Dropped, not retried: the next pass does not even read the block.
    env.server.clear_requests()
    lead.step()
    assert len(env.audit()) == 1
    assert [r for r in env.server.requests if r.resource == "ipamblocks"] == []
    assert sim.truth.violations == []
    assert ip in sim.truth.in_use_ips()


def test_tunnel_ip_of_a_node_recreated_with_the_same_name_is_kept(env: Env) -> None:
    sim = env.sim
    sim.add_node("node-a")
    sim.add_node("node-x")
    env.decide()
    lead = env.leader()
    sim.delete_node("node-x")
    assert env.decide() == 1  # its tunnel IP: nothing else is on it
    # The node comes back under the same name (#3589) before the leader acts: its tunnel IP must stay.
    from lab.cluster.objects import node_object

    env.server.store.create("nodes", None, node_object("node-x"))
    lead.step()
    [rec] = env.audit()
    assert (rec.result, rec.reason) == (Result.REFUSED_VALID, "tunnel-node-exists")
    assert rec.evidence["recheck"]["node"] == "exists"
    assert env.writes() == []
