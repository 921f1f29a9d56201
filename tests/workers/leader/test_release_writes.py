"""The leader's releases against blocks and handles written meanwhile: a block written under the release is
read again, a missing IPAMHandle is tolerated, a handle is read once, and unaffine blocks a release empties
(or leaves with Windows-reserved ordinals only) are deleted with preconditions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kubeio.election import Leadership
from shared.audit import audit as audit_inventory
from shared.netaddr import cidr_to_name
from shared.verdicts import Release
from tests.fixtures.leader import GRACE, Env, leader_settings
from tests.workers.leader.release_helpers import _exists
from workers.leader.audit import Result
from workers.leader.loop import Leader


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
