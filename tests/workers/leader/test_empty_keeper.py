"""Which empty blocks go, and which one a node keeps (`shared.keeper`), in `check` and in the leader alike.

Calico releases a node's empty blocks while the node has more than one affine block (its count drops with
each release), whether or not the node still exists; which block of an all-empty node survives is left to
Go's map order.  ipamgc keeps the lowest-addressed one, and `ipamgc check` names it (`last-block`).
"""

from __future__ import annotations

from typing import Any

from lab.apiserver.store import SimApiError
from lab.cluster.objects import node_object
from shared.audit import audit
from shared.gcrecords import EmptyBlock, encode_empty
from shared.keeper import keeper_of, network_order, release_order
from shared.netaddr import cidr_to_name
from shared.verdicts import Reason, Release
from tests.fixtures.leader import GRACE, Env
from workers.leader.audit import Result
from workers.leader.empty_blocks import Timer


def _block(env: Env, cidr: str) -> dict[str, Any] | None:
    try:
        return env.server.store.get("ipamblocks", None, cidr_to_name(cidr))
    except SimApiError:
        return None


def _released(env: Env) -> list[str]:
    return sorted(r.block for r in env.audit() if r.rule == "empty-block" and r.result is Result.RELEASED)


def _check(env: Env) -> dict[str, tuple[Release, Reason]]:
    report = audit(env.inventory(), env.grace)
    return {e.block: (e.release, e.reason) for e in report.empty_blocks}


def test_the_keeper_is_the_lowest_addressed_block_ipv4_first() -> None:
    cidrs = ["10.0.0.192/26", "fd00::/122", "10.0.0.64/26", "10.0.1.0/26"]
    assert keeper_of(cidrs) == "10.0.0.64/26"  # by address, not by text ("10.0.0.192" < "10.0.0.64")
    assert release_order(cidrs) == ["10.0.0.192/26", "10.0.1.0/26", "fd00::/122", "10.0.0.64/26"]
    assert network_order("junk") > network_order("fd00::/122")
    assert keeper_of([]) is None


def test_an_all_empty_node_keeps_the_block_check_names_whatever_order_the_timers_end_in(env: Env) -> None:
    env.server.store.create("nodes", None, node_object("node-e"))  # no tunnel IP: every block empty
    low = env.sim.empty_block("node-e")
    mid = env.sim.empty_block("node-e")
    high = env.sim.empty_block("node-e")
    assert keeper_of([high, mid, low]) == low
    env.decide()
    # `check` says which one stays: the lowest, as the last block; the others go after the grace period.
    assert _check(env) == {
        low: (Release.NEVER, Reason.LAST_BLOCK),
        mid: (Release.AFTER_GRACE, Reason.EMPTY_BLOCK),
        high: (Release.AFTER_GRACE, Reason.EMPTY_BLOCK),
    }
    # The keeper was emptied first, so its grace period ends first: it still stays.
    t0 = env.clock.now()
    env.redis.hset(env.keys.empty, low, encode_empty(EmptyBlock("node-e", t0)))
    env.redis.hset(env.keys.empty, mid, encode_empty(EmptyBlock("node-e", t0 + 100)))
    env.redis.hset(env.keys.empty, high, encode_empty(EmptyBlock("node-e", t0 + 100)))
    lead = env.leader()
    lead.step()
    env.clock.advance(GRACE + 1)
    lead.step()  # the keeper's grace period is over, the others' not yet
    assert _released(env) == []
    env.clock.advance(100.0)
    lead.step()
    assert _released(env) == sorted([mid, high])
    assert _block(env, low) is not None
    env.sync()
    env.clock.advance(10 * GRACE)
    lead.step()
    assert _block(env, low) is not None and _released(env) == sorted([mid, high])
    assert env.consistent() == []


def test_two_empty_blocks_whose_grace_ends_in_one_pass_leave_one(env: Env) -> None:
    """The count drops with each release (Calico's forgetBlock): without it, the keeper (whose timer ran
    while the node still had a block in use, then emptied) looks releasable in the same pass."""
    env.server.store.create("nodes", None, node_object("node-e"))
    low = env.sim.empty_block("node-e")
    high = env.sim.empty_block("node-e")
    env.decide()
    t0 = env.clock.now()
    for cidr in (low, high):  # both empty since t0, both timers running since t0
        env.redis.hset(env.keys.empty, cidr, encode_empty(EmptyBlock("node-e", t0)))
        env.redis.hset(env.keys.emptyblocks, cidr, Timer(t0, t0).encode())
    env.clock.advance(GRACE + 1)
    lead = env.leader()
    lead.step()
    assert _released(env) == [high]
    assert _block(env, low) is not None and _block(env, high) is None
    [rec] = [r for r in env.audit() if r.rule == "empty-block"]
    assert rec.evidence["affine_blocks"] == 2


def test_a_node_with_a_block_in_use_loses_every_empty_block(env: Env) -> None:
    env.sim.add_node("node-a")  # its tunnel IP keeps its first block in use
    low = env.sim.empty_block("node-a")
    high = env.sim.empty_block("node-a")
    env.decide()
    assert {c: v[0] for c, v in _check(env).items()} == {low: Release.AFTER_GRACE, high: Release.AFTER_GRACE}
    lead = env.leader()
    lead.step()
    env.clock.advance(GRACE + 1)
    lead.step()
    assert _released(env) == sorted([low, high])
    assert env.consistent() == []


def test_a_deleted_node_still_in_use_loses_its_empty_blocks_after_grace_but_not_its_last(env: Env) -> None:
    """Calico's releaseUnusedBlocks does not ask whether the node exists: a deleted node whose pods are
    still there (so it cannot be cleaned up yet) loses its empty blocks after the grace period."""
    sim = env.sim
    sim.add_node("node-a")
    sim.add_node("node-x")
    sim.create_pod("ns", "web", "node-x")  # node-x's first block: tunnel IP and pod
    [in_use] = sim.cni.node_blocks("node-x", 4)
    spare_1 = sim.empty_block("node-x")
    spare_2 = sim.empty_block("node-x")
    env.decide()
    lead = env.leader()
    lead.step()
    sim.delete_node("node-x")  # its pod object stays (valid: it reports its IP): not drained
    env.decide()
    assert _check(env)[spare_1][0] is Release.AFTER_GRACE
    lead.step()
    assert _released(env) == []
    env.clock.advance(GRACE + 1)
    env.decide()
    lead.step()
    # node-x: both empty blocks go, its block in use stays with its affinity (the node is not drained).
    assert _block(env, spare_1) is None and _block(env, spare_2) is None
    assert [a["spec"]["cidr"] for a in _affinities(env, "node-x")] == [in_use]
    assert _block(env, in_use) is not None
    assert sim.truth.violations == []
    assert env.consistent() == []


def _affinities(env: Env, node: str) -> list[dict[str, Any]]:
    return [a for a in env.server.store.list("blockaffinities")["items"] if a["spec"]["node"] == node]
