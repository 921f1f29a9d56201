"""The leader releases every injected leak, and nothing the ground truth says is in use.

Each test builds a cluster through the simulated CNI, lets the watcher (a relist into the mirror) and the
shard jobs (in-process, fake clock) see it, injects leaks, and steps a leader that talks to the simulated
API server over HTTP with the official client.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kubeio.election import Leadership
from lab.apiserver.store import SimApiError
from shared.audit import audit as audit_inventory
from shared.netaddr import cidr_to_name
from shared.verdicts import Release
from tests.fixtures.leader import GRACE, Env, leader_settings
from workers.leader.audit import Result
from workers.leader.loop import Leader
from workers.leader.rate_limit import TokenBucket


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


def _exists(env: Env, plural: str, name: str) -> bool:
    try:
        env.server.store.get(plural, None, name)
    except SimApiError:
        return False
    return True


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


def _dead_node_with_pods(env: Env, pods: int) -> None:
    sim = env.sim
    sim.add_node("node-a")
    sim.add_node("node-dead")
    for i in range(pods):
        sim.create_pod("ns", f"p{i}", "node-dead")
    env.decide()
    sim.leak_node_deleted("node-dead")
    assert env.decide() == pods + 1


def test_releases_per_pass_are_bounded(env: Env) -> None:
    _dead_node_with_pods(env, 5)
    lead = env.leader(max_releases_per_pass=2)
    for expected in (2, 4, 6):
        lead.step()
        assert lead.stats.released == expected
    assert env.sim.truth.violations == [] and env.sim.truth.leaked_ips() == set()


def test_releases_per_second_are_rate_limited(env: Env) -> None:
    _dead_node_with_pods(env, 5)
    t = [0.0]
    lead = env.leader(deleted_node_rate_limit=2.0, monotonic=lambda: t[0])
    lead.step()
    lead.step()  # the bucket is empty: nothing more until time passes
    assert lead.stats.released == 2
    t[0] = 1.0
    lead.step()
    assert lead.stats.released == 4
    t[0] = 10.0
    lead.step()
    assert lead.stats.released == 6
    assert env.sim.truth.violations == [] and env.sim.truth.leaked_ips() == set()


def test_a_rate_limited_pass_reads_the_mirror_for_what_it_can_release(env: Env) -> None:
    # 20 handles due at once (a lost node), 2 releases a second: each pass reads the mirror for the
    # handles it can release, oldest first, not for all 21 again (quadratic in a lost node's pods).
    _dead_node_with_pods(env, 20)
    t = [0.0]
    lead = env.leader(deleted_node_rate_limit=2.0, monotonic=lambda: t[0])
    read: list[list[str]] = []
    real = lead.gate._read_mirror

    def spy(handles: list[str]) -> Any:
        read.append(list(handles))
        return real(handles)

    lead.gate._read_mirror = spy  # type: ignore[method-assign]
    lead.step()
    assert lead.stats.released == 2
    assert [len(handles) for handles in read] == [2]
    lead.step()  # the bucket is empty: nothing is read, nothing released
    assert lead.stats.released == 2 and len(read) == 1
    for second in range(1, 12):
        t[0] = float(second)
        lead.step()
    assert lead.stats.released == 21
    assert sum(len(handles) for handles in read) == 21  # each handle read once
    assert env.sim.truth.violations == [] and env.sim.truth.leaked_ips() == set()


def test_a_deleted_node_s_ips_take_their_own_bucket_and_a_live_node_s_leaks_the_shared_one(env: Env) -> None:
    # A dead node's 6 IPs (5 pods and its tunnel, a handle each) and a live node's leak, due together:
    # the shared limit (1/s) lets the live node's leak go; the deleted node's own (2/s) two of its IPs a
    # second, whatever the shared bucket holds, and neither holds back the other.
    _dead_node_with_pods(env, 5)
    sim = env.sim
    sim.create_pod("ns", "gone", "node-a")
    env.decide()
    sim.leak_pod_deleted_without_cni_del("ns", "gone")
    env.decide()
    env.sync()
    env.clock.advance(GRACE + 1)
    assert env.decide() > 0
    t = [0.0]
    lead = env.leader(rate_limit=1.0, deleted_node_rate_limit=2.0, monotonic=lambda: t[0])
    lead.step()
    assert lead.stats.released == 1 + 2  # both buckets start full
    lead.step()
    assert lead.stats.released == 3  # both empty
    for second, released in ((1, 5), (2, 7)):
        t[0] = float(second)
        lead.step()
        assert lead.stats.released == released
    assert sim.truth.leaked_ips() == set() and sim.truth.violations == []


def test_token_bucket() -> None:
    t = [0.0]
    bucket = TokenBucket(2.0, monotonic=lambda: t[0])
    assert bucket.take(2) and not bucket.take(1)
    assert bucket.wait_for(1) == 0.5
    t[0] = 0.5
    assert bucket.take(1) and not bucket.take(1)
    assert TokenBucket(0).take(10**6)


class _WriterFirst:
    """The leader's API, with someone else writing the block just before the leader's first write."""

    def __init__(self, api: Any, before: Callable[[], None]) -> None:
        self.api = api
        self.before = before
        self.fired = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.api, name)

    def replace(self, plural: str, body: dict[str, Any]) -> dict[str, Any]:
        if plural == "ipamblocks" and not self.fired:
            self.fired = True
            self.before()
        result: dict[str, Any] = self.api.replace(plural, body)
        return result


def test_a_block_written_under_the_release_is_read_again_and_re_evaluated(env: Env) -> None:
    sim = env.sim
    sim.add_node("node-a")
    sim.create_pod("ns", "web-0", "node-a")
    env.decide()
    [ip] = sim.leak_pod_deleted_without_cni_del("ns", "web-0")
    env.decide()
    env.clock.advance(GRACE + 1)
    assert env.decide() == 1
    fresh: list[str] = []
    api = _WriterFirst(env.api("leader-a"), lambda: fresh.extend(sim.create_pod("ns", "web-1", "node-a")))
    lead = Leader(leader_settings(), env.redis, api, Leadership.granted("leader-a"), clock=env.clock)
    lead.start()
    lead.step()
    puts = [r for r in env.writes("leader-a") if r.resource == "ipamblocks"]
    assert [r.status for r in puts] == [409, 200]  # stale resourceVersion refused, then re-read and written
    assert [(r.result, r.ip) for r in env.audit()] == [(Result.RELEASED, ip)]
    assert fresh and fresh[0] in sim.truth.in_use_ips()
    assert sim.truth.violations == [] and sim.truth.leaked_ips() == set()
    assert env.consistent() == []


def test_a_missing_ipamhandle_is_tolerated(env: Env) -> None:
    sim = env.sim
    sim.add_node("node-a")
    sim.add_node("node-dead")
    sim.create_pod("ns", "p", "node-dead")
    handle, _ = sim.pod_handles[("ns", "p")]
    env.decide()
    sim.leak_node_deleted("node-dead")
    env.decide()
    env.server.store.delete("ipamhandles", None, handle.lower())  # #3940: the handle object is gone
    env.leader().step()
    assert sim.truth.leaked_ips() == set() and sim.truth.violations == []
    assert env.consistent() == []


def test_an_unaffine_block_emptied_by_a_release_is_deleted_with_preconditions(env: Env) -> None:
    sim = env.use_pools([("10.7.0.0/29", 30)])
    sim.add_node("node-x")
    sim.add_node("node-y")
    for i in range(4):
        sim.create_pod("ns", f"y{i}", "node-y")  # the last one borrows from node-x's block
    [x_block] = [
        a["spec"]["cidr"]
        for a in env.server.store.list("blockaffinities")["items"]
        if a["spec"]["node"] == "node-x"
    ]
    # node-x goes; its tunnel IP is released and its affinity cleared (calicoctl's non-empty release)
    from workers.leader.cleanup import release_block_affinity

    env.decide()
    sim.delete_node("node-x")
    lead = env.leader()
    env.decide()
    lead.step()
    release_block_affinity(env.api("admin"), "node-x", x_block, lambda: None, must_be_empty=False)
    assert env.server.store.get("ipamblocks", None, cidr_to_name(x_block))["spec"]["affinity"] is None
    sim.leak_pod_deleted_without_cni_del("ns", "y3")  # the last IP in the now unaffine block leaks
    env.decide()
    env.clock.advance(GRACE + 1)
    assert env.decide() == 1
    env.server.clear_requests()
    lead.step()
    name = cidr_to_name(x_block)
    block_writes = [(r.method, r.status) for r in env.writes("leader-a") if r.name == name]
    assert block_writes == [("PUT", 200), ("DELETE", 200)]  # soft delete, then the preconditioned delete
    assert all(r.precondition for r in env.writes("leader-a"))
    assert not _exists(env, "ipamblocks", name)
    assert sim.truth.violations == [] and sim.truth.leaked_ips() == set()
    assert env.consistent() == []


def _leaked_pod_decided(env: Env, *, dual_stack: bool, keep: bool) -> Leader:
    """A pod `ns/gone` on `node-a` leaked, its grace period over and its decision emitted; the leader."""
    sim = env.sim
    sim.add_node("node-a")
    sim.create_pod("ns", "gone", "node-a", dual_stack=dual_stack)
    if keep:
        sim.create_pod("ns", "keep", "node-a")
    assert env.decide() == 0
    lead = env.leader()
    lead.step()
    sim.leak_pod_deleted_without_cni_del("ns", "gone")
    env.decide()  # the candidate's timer starts
    env.sync()
    env.clock.advance(GRACE + 1)
    assert env.decide() > 0
    return lead


def test_a_pod_leak_release_reads_its_handle_once(env: Env) -> None:
    """The handle read for all-or-none is the one the decrement writes from (conditional on its
    resourceVersion): one GET of the IPAMHandle per release, not two."""
    sim = env.sim
    lead = _leaked_pod_decided(env, dual_stack=False, keep=True)
    before = len(env.server.requests)
    lead.step()
    assert sim.truth.leaked_ips() == set() and sim.truth.violations == []
    handles = [(r.method, r.status) for r in env.server.requests[before:] if r.resource == "ipamhandles"]
    assert handles == [("GET", 200), ("PUT", 200), ("DELETE", 200)]


def test_a_handle_changed_between_its_read_and_the_decrement_is_read_again(env: Env) -> None:
    """Reusing the earlier read is safe: the decrement's PUT is conditional, so a handle written in
    between (here: a second IP of the same handle allocated elsewhere) costs a 409 and a re-read, and
    the count written is the fresh one's."""
    sim = env.sim
    lead = _leaked_pod_decided(env, dual_stack=True, keep=False)
    store = env.server.store
    [name] = [
        h["metadata"]["name"]
        for h in store.list("ipamhandles")["items"]
        if h["metadata"]["name"].startswith("k8s-pod-network.")
    ]
    original_get = lead.api.get
    bumped = False

    def get_then_bump(plural: str, obj_name: str) -> Any:
        nonlocal bumped
        got = original_get(plural, obj_name)
        if plural == "ipamhandles" and obj_name == name and not bumped:
            bumped = True  # someone writes the handle right after our first read of it
            live = store.get("ipamhandles", None, name)
            live["metadata"]["annotations"] = {"touched": "yes"}
            store.replace("ipamhandles", None, name, live)
        return got

    lead.api.get = get_then_bump  # type: ignore[method-assign]
    before = len(env.server.requests)
    lead.step()
    handles = [(r.method, r.status) for r in env.server.requests[before:] if r.resource == "ipamhandles"]
    assert ("PUT", 409) in handles or ("DELETE", 409) in handles
    assert not _exists(env, "ipamhandles", name)
    assert sim.truth.violations == []


def test_an_unaffine_block_left_with_only_windows_reserved_ordinals_is_deleted_as_calico_does(
    env: Env,
) -> None:
    """libcalico-go `releaseIPsFromBlock`: a block left unaffine and empty in the library's sense (its
    Windows-reserved ordinals do not count) is deleted; ipamgc used to write it back and keep it."""
    sim = env.use_pools([("10.7.0.0/28", 29)])  # two /29 blocks
    sim.windows_node("win-1")  # 10.7.0.0/29: ordinals 0, 1, 2, 7 reserved, 3 its tunnel IP
    sim.add_node("node-y")  # 10.7.0.8/29: its tunnel IP, then seven pods fill it
    for i in range(8):
        sim.create_pod("ns", f"y{i}", "node-y")  # the last one borrows from win-1's block
    [win_block] = sim.cni.node_blocks("win-1", 4)
    name = cidr_to_name(win_block)
    _, [borrowed] = sim.pod_handles[("ns", "y7")]
    assert borrowed == "10.7.0.4"
    env.decide()
    lead = env.leader()
    sim.delete_node("win-1")
    env.decide()
    lead.step()  # the tunnel IP goes; the block still lends an IP, so win-1's affinity stays
    # its affinity given up with the block in use (calicoctl's non-empty release): the block is unaffine
    from workers.leader.cleanup import release_block_affinity

    release_block_affinity(env.api("admin"), "win-1", win_block, lambda: None, must_be_empty=False)
    spec = env.server.store.get("ipamblocks", None, name)["spec"]
    assert spec["affinity"] is None
    handles = sorted({spec["attributes"][i]["handle_id"] for i in spec["allocations"] if i is not None})
    assert handles == [sim.pod_handles[("ns", "y7")][0], "windows-reserved-ipam-handle"]

    sim.leak_pod_deleted_without_cni_del("ns", "y7")  # the block's last IP that is not reserved
    env.decide()
    # `ipamgc check` says what the leader is about to do: the block goes with that release.
    fates = {
        e.block: (e.reason.value, e.release) for e in audit_inventory(env.inventory(), GRACE).empty_blocks
    }
    assert fates[win_block] == ("unaffine-block", Release.AFTER_GRACE)
    env.clock.advance(GRACE + 1)
    assert env.decide() == 1
    env.server.clear_requests()
    lead.step()
    [rec] = [r for r in env.audit() if r.ip == borrowed]
    assert rec.result is Result.RELEASED
    block_writes = [(r.method, r.status) for r in env.writes("leader-a") if r.name == name]
    assert block_writes == [("PUT", 200), ("DELETE", 200)]  # soft delete, then the preconditioned delete
    assert not _exists(env, "ipamblocks", name)
    # The reserved ordinals went with the block (win-1 is gone: nothing used them); nothing in use was freed.
    assert sim.truth.violations == [] and sim.truth.leaked_ips() == set()
    assert env.consistent() == []


def test_a_rate_limited_backlog_waits_for_a_batch_of_tokens_not_one(env: Env) -> None:
    # 21 handles due, 20 releases a second: once the bucket is empty the leader sleeps until a quarter
    # of a second's worth has come (5 tokens), not 1/20 s: a pass re-sorts everything due.
    _dead_node_with_pods(env, 20)
    t = [0.0]
    lead = env.leader(deleted_node_rate_limit=20.0, monotonic=lambda: t[0])
    lead.step()
    assert lead.stats.released == 20
    assert lead.gate.next_due(lead.clock.now()) == pytest.approx(0.05)  # one handle left: one token
    _dead_node_with_pods_more(env)
    lead.step()
    assert lead.gate.next_due(lead.clock.now()) == pytest.approx(0.25)


def _dead_node_with_pods_more(env: Env) -> None:
    sim = env.sim
    sim.add_node("node-dead-2")
    for i in range(10):
        sim.create_pod("ns", f"q{i}", "node-dead-2")
    env.decide()
    sim.leak_node_deleted("node-dead-2")
    env.decide()
