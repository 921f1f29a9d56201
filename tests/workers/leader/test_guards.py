"""Guards a mutation run found undefended: each test here fails when its guard is removed.

- the live "node is back" check before a deleted node's cleanup (`DeletedNodes._clean`);
- the IPAMHandle deleted when its per-block map empties (`decrement_handle`);
- the Windows-reserved exception of the library's emptiness (`library_empty`), which lets a deleted
  Windows node's block go;
- the leader's sequence-number check against the mirror before anything live (`Leader._evaluate`).
(The per-node block count and the empty-block timer reset are defended in test_empty_keeper.py and
test_empty_index.py.)
"""

from __future__ import annotations

from typing import Any

import pytest

from lab.apiserver.store import SimApiError
from lab.cluster.objects import node_object
from shared.names import handle_name
from shared.netaddr import cidr_to_name
from tests.fixtures.leader import GRACE, Env
from workers.leader.audit import Result
from workers.leader.cleanup import Done, release_block_affinity
from workers.leader.handle_count import HandleCountMismatch, decrement_handle


def _get(env: Env, plural: str, name: str) -> dict[str, Any] | None:
    try:
        return env.server.store.get(plural, None, name)
    except SimApiError:
        return None


def _affinities(env: Env, node: str) -> list[str]:
    items = env.server.store.list("blockaffinities")["items"]
    return sorted(a["spec"]["cidr"] for a in items if a["spec"]["node"] == node)


def test_a_node_back_in_the_api_before_the_mirror_knows_keeps_its_blocks(env: Env) -> None:
    env.sim.add_node("node-a")
    env.server.store.create("nodes", None, node_object("node-x"))  # no tunnel IP: nothing to drain
    block = env.sim.empty_block("node-x")
    env.decide()
    lead = env.leader()
    lead.step()
    env.server.store.delete("nodes", None, "node-x")
    env.sync()  # the watcher saw the delete: node-x's block is a deleted node's
    assert env.redis.hget(env.keys.nodes, "node-x") is None
    env.server.store.create("nodes", None, node_object("node-x"))  # back, before the watcher sees it
    lead.step()
    assert _affinities(env, "node-x") == [block]
    assert _get(env, "ipamblocks", cidr_to_name(block)) is not None
    assert [r for r in env.audit() if r.rule == "node-missing"] == []
    assert env.writes() == []


def test_an_ipamhandle_is_deleted_when_its_last_address_is_released(env: Env) -> None:
    sim = env.sim
    sim.add_node("node-a")
    sim.add_node("node-dead")
    sim.create_pod("ns", "v4", "node-dead")
    sim.create_pod("ns", "dual", "node-dead", dual_stack=True)
    handles = [sim.pod_handles[("ns", p)][0] for p in ("v4", "dual")]
    env.decide()
    assert all(_get(env, "ipamhandles", handle_name(h)) is not None for h in handles)
    sim.leak_node_deleted("node-dead")
    env.decide()
    env.leader().step()
    assert sim.truth.leaked_ips() == set()
    assert [h for h in handles if _get(env, "ipamhandles", handle_name(h)) is not None] == []
    deletes = [r for r in env.writes() if r.method == "DELETE" and r.resource == "ipamhandles"]
    assert {handle_name(h) for h in handles} <= {r.name for r in deletes}  # and the tunnel IP's
    assert all(r.precondition for r in deletes)
    assert env.consistent() == []


def test_a_deleted_windows_nodes_block_with_only_reserved_ordinals_is_released(env: Env) -> None:
    sim = env.sim
    sim.add_node("node-a")
    sim.windows_node("win-1")  # its block: four Windows-reserved ordinals and a tunnel IP
    [block] = _affinities(env, "win-1")
    env.decide()
    lead = env.leader()
    sim.delete_node("win-1")
    env.decide()
    lead.step()  # the tunnel IP goes, then the node: its block holds only reserved ordinals
    assert _affinities(env, "win-1") == []
    assert _get(env, "ipamblocks", cidr_to_name(block)) is None
    [rec] = [r for r in env.audit() if r.rule == "node-missing" and not r.ip]
    assert (rec.result, rec.block) == (Result.RELEASED, block)
    assert sim.truth.violations == []


def test_a_decision_whose_sequence_number_the_mirror_no_longer_has_is_dropped_before_any_api_call(
    env: Env,
) -> None:
    # /30 blocks: node-a's block is full (tunnel IP, three pods), so a freed ordinal is re-used next.
    sim = env.use_pools([("10.9.0.0/24", 30)])
    sim.add_node("node-a")
    for i in range(3):
        sim.create_pod("ns", f"p{i}", "node-a")
    env.decide()
    lead = env.leader()
    handle, [ip] = sim.pod_handles[("ns", "p0")]
    sim.leak_pod_deleted_without_cni_del("ns", "p0")
    env.decide()
    env.clock.advance(GRACE + 1)
    assert env.decide() == 1
    # The same handle gets the same IP again (freed by a late CNI DEL, then re-assigned: a new sequence
    # number), and the watcher mirrors it before the leader reads the decision.
    sim.truth.cni_freeing([ip], True)
    assert sim.cni.release_ips(handle, [ip]) == [ip]
    sim.truth.cni_freeing([ip], False)
    attrs = {"namespace": "ns", "node": "node-a", "pod": "p0"}
    assert sim.cni.assign("node-a", handle, attrs) == ip
    sim.truth.allocated(ip, handle, "ns/p0", env.clock.now())
    env.sync()
    env.server.clear_requests()
    lead.step()
    [rec] = env.audit()
    assert (rec.result, rec.ip) == (Result.REFUSED_CONFLICT, ip)
    assert "since the decision" in rec.reason
    assert env.server.requests == []  # decided on the mirror alone: no live read, no write
    assert env.pending() == 0
    assert sim.truth.violations == []


def test_a_handle_without_the_released_blocks_entry_is_left_as_it_is_as_calico_does(env: Env) -> None:
    """Calico's decrementBlock errors when the handle has no entry for the block (or fewer addresses than
    released) and leaves the handle; ipamgc used to pop the entry and could delete the handle."""
    sim = env.sim
    sim.add_node("node-a")
    sim.create_pod("ns", "p", "node-a", dual_stack=True)
    handle, [v4, _] = sim.pod_handles[("ns", "p")]
    name = handle_name(handle)
    obj = env.server.store.get("ipamhandles", None, name)
    [v4_block] = [c for c in obj["spec"]["block"] if "." in c]
    obj["spec"]["block"][v4_block] = 0  # fewer than the release takes
    env.server.store.replace("ipamhandles", None, name, obj)
    before = env.server.store.get("ipamhandles", None, name)
    with pytest.raises(HandleCountMismatch):
        decrement_handle(env.api("manual"), handle, v4_block, 1)
    del obj["spec"]["block"][v4_block]
    obj["metadata"]["resourceVersion"] = before["metadata"]["resourceVersion"]
    env.server.store.replace("ipamhandles", None, name, obj)
    before = env.server.store.get("ipamhandles", None, name)
    with pytest.raises(HandleCountMismatch):
        decrement_handle(env.api("manual"), handle, v4_block, 1)
    assert env.server.store.get("ipamhandles", None, name) == before  # untouched
    assert env.writes("manual") == []
    assert v4  # the pod's IPs are untouched too: only the handle object was looked at


def test_an_affinity_whose_block_is_missing_is_left_as_calico_leaves_it(env: Env) -> None:
    env.sim.add_node("node-a")
    env.server.store.create("nodes", None, node_object("node-x"))
    block = env.sim.empty_block("node-x")
    env.server.store.delete("ipamblocks", None, cidr_to_name(block))  # the affinity outlives its block
    api = env.api("manual")
    assert release_block_affinity(api, "node-x", block, lambda: None) is Done.NO_BLOCK
    assert _affinities(env, "node-x") == [block] and env.writes("manual") == []
