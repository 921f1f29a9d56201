"""Whoever can write to Redis can neither run code nor make the leader release an IP in use.

The leader trusts nothing it reads from Redis for a release: a decision is re-checked live (the pod and
node from the API, the block's sequence number, handle and attributes from the live block), and handle
all-or-none is checked against the live blocks too.  Each test forges what an attacker with Redis write
access could, and shows the leader refuses it, records why in the audit, and writes nothing.
"""

from __future__ import annotations

import dataclasses
import time

import msgpack

from shared.gcrecords import Decision, encode_decision
from shared.keys import handle_field
from shared.model import allocation_id
from shared.parse import parse_block
from shared.shard import shard_of
from tests.fixtures.leader import GRACE, Env
from tests.handles import remove_handle_field
from workers.leader.audit import Result


def _live_pod(env: Env, dual: bool = False) -> tuple[str, list[str]]:
    env.sim.add_node("node-a")
    env.sim.add_node("node-b")
    env.sim.create_pod("ns", "web", "node-a", dual_stack=dual)
    assert env.decide() == 0
    return env.sim.pod_handles[("ns", "web")]


def _decision_for(env: Env, handle: str, ip: str, **change: object) -> Decision:
    block = next(
        parse_block(b)
        for b in env.server.store.list("ipamblocks")["items"]
        if any(a.ip == ip for a in parse_block(b).iter_allocations())
    )
    a = next(a for a in block.iter_allocations() if a.ip == ip)
    d = Decision(
        alloc_id=allocation_id(handle, ip),
        ip=ip,
        handle=handle,
        block=a.block,
        node="node-a",
        ordinal=a.ordinal,
        sequence_number=a.sequence_number,
        block_resource_version=block.resource_version,
        type="pod",
        reason="pod-missing",
        node_exists=False,
        pod={"lookup": "missing"},
        first_seen=time.time() - 3600,
        decided_at=time.time(),
        shard=shard_of("node-a"),
    )
    return dataclasses.replace(d, **change)  # type: ignore[arg-type]


def _forge(env: Env, d: Decision) -> None:
    env.redis.xadd(env.keys.decisions, {"id": d.alloc_id, "d": encode_decision(d)})


def _no_release(env: Env) -> None:
    assert [w for w in env.writes() if w.resource == "ipamblocks"] == []
    assert env.sim.truth.violations == []


def test_a_forged_decision_for_an_ip_in_use_is_refused_by_the_live_recheck(env: Env) -> None:
    handle, [ip] = _live_pod(env)
    _forge(env, _decision_for(env, handle, ip))  # "node gone, pod missing": both lies
    env.server.clear_requests()
    env.leader().step()
    [rec] = [r for r in env.audit() if r.ip == ip]
    assert rec.result is Result.REFUSED_VALID, rec
    assert rec.evidence["recheck"]["pod"]["lookup"] == "found"
    _no_release(env)
    assert env.pending() == 0


def test_a_forged_decision_with_a_stale_sequence_number_is_refused_as_a_conflict(env: Env) -> None:
    handle, [ip] = _live_pod(env)
    env.sim.leak_pod_deleted_without_cni_del("ns", "web")  # a real leak, but the decision lies about it
    d = _decision_for(env, handle, ip)
    _forge(env, dataclasses.replace(d, sequence_number=d.sequence_number + 7))
    env.redis.hset(
        env.keys.alloc(shard_of("node-a")),
        d.alloc_id,
        msgpack.packb(
            [
                1,
                d.block,
                d.ordinal,
                d.sequence_number + 7,
                {"node": "node-a", "namespace": "ns", "pod": "web"},
            ]
        ),
    )
    env.server.clear_requests()
    env.leader().step()
    [rec] = [r for r in env.audit() if r.ip == ip]
    assert rec.result is Result.REFUSED_CONFLICT and "sequence number" in rec.reason
    assert [w for w in env.writes() if w.resource == "ipamblocks"] == []


def test_forged_allocation_attributes_cannot_steer_the_live_recheck(env: Env) -> None:
    """The mirror's record of a live pod's IP rewritten to name a pod that does not exist: the live
    re-check of *that* pod would say "missing"; the live block says whom the IP belongs to."""
    handle, [ip] = _live_pod(env)
    d = _decision_for(env, handle, ip, node_exists=True)
    forged = {"node": "node-a", "namespace": "ns", "pod": "ghost"}
    env.redis.hset(
        env.keys.alloc(shard_of("node-a")),
        d.alloc_id,
        msgpack.packb([1, d.block, d.ordinal, d.sequence_number, forged]),
    )
    _forge(env, d)
    env.server.clear_requests()
    env.leader().step()
    [rec] = [r for r in env.audit() if r.ip == ip]
    assert rec.result in (Result.REFUSED_CONFLICT, Result.REFUSED_VALID), rec
    _no_release(env)


def test_a_forged_handle_index_cannot_break_handle_all_or_none(env: Env) -> None:
    """#5044: a dual-stack pod whose status lists only its IPv4 keeps its IPv6 (invalid by the rules) as
    long as the IPv4 is valid.  Hiding the IPv4 from the handle index must not let the IPv6 go."""
    env.sim.add_node("node-a")
    env.sim.dual_stack_single_status("ns", "dual", "node-a")
    handle, [v4, v6] = env.sim.pod_handles[("ns", "dual")]
    env.decide()
    env.clock.advance(GRACE + 1)
    env.redis.sadd(env.keys.dirty(shard_of("node-a")), allocation_id(handle, v6))
    assert env.validate() == 1  # the IPv6 is decided: a confirmed leak by the rules, held by its handle
    remove_handle_field(
        env.redis, env.keys, handle, handle_field(allocation_id(handle, v4)), "node-a"
    )  # the forgery
    env.server.clear_requests()
    env.leader().step()
    [rec] = [r for r in env.audit() if r.ip == v6]
    assert rec.result is Result.HELD_BY_HANDLE, rec
    _no_release(env)
