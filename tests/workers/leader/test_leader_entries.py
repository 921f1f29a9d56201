"""Malformed input at the leader: decisions, mirror entries and Calico objects it reads during a release
or a cleanup.  Each is logged, counted (`LeaderStats.malformed`, the audit trail), acked or skipped; the
pass goes on with the rest; nothing is ever written on account of one of them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import msgpack
import pytest

from shared.codec import pack
from shared.errors import MalformedObject
from shared.gcrecords import Decision, decode_decision, encode_decision
from shared.keys import handle_field
from shared.model import allocation_id
from shared.netaddr import cidr_to_name
from shared.shard import shard_of
from tests.fixtures.leader import Env
from tests.handles import add_handle_field
from workers.leader.audit import Result
from workers.leader.handle_count import decrement_handle
from workers.leader.release import BlockReleaser


def _dead_node(env: Env) -> set[str]:
    sim = env.sim
    sim.add_node("node-a")
    sim.add_node("node-dead")
    sim.create_pod("ns", "p1", "node-dead")
    sim.create_pod("ns", "p2", "node-a")
    env.decide()
    sim.leak_node_deleted("node-dead")
    leaked = sim.truth.leaked_ips()
    assert env.decide() == len(leaked) == 2
    return leaked


def _a_decision(env: Env) -> Decision:
    _, fields = env.redis.xrange(env.keys.decisions, count=1)[0]
    return decode_decision(fields[b"d"])


def _packed(d: Decision, **change: object) -> bytes:
    return encode_decision(dataclasses.replace(d, **change))  # type: ignore[arg-type]


def _raw(d: Decision, index: int, value: object) -> bytes:
    fields = msgpack.unpackb(encode_decision(d))
    fields[index] = value
    return bytes(msgpack.packb(fields))


DECISIONS: list[tuple[str, Callable[[Decision], bytes | None]]] = [
    ("truncated msgpack", lambda d: encode_decision(d)[:20]),
    ("not msgpack", lambda d: b"\xc1\xc1"),
    ("unknown version tag", lambda d: _raw(d, 0, 2)),
    ("wrong arity", lambda d: bytes(msgpack.packb(msgpack.unpackb(encode_decision(d))[:10]))),
    ("a field of the wrong type", lambda d: _raw(d, 6, "seven")),
    ("no `d` field", lambda d: None),
    ("ordinal disagrees with the IP", lambda d: _packed(d, ordinal=(d.ordinal + 1) % 64)),
    ("allocation id names another IP", lambda d: _packed(d, ip="10.255.255.1")),
    ("IP outside its block", lambda d: _packed(d, ip="192.168.0.1", alloc_id=f"{d.handle}/192.168.0.1")),
    ("IP not in canonical form", lambda d: _packed(d, ip="010.64.0.1")),
    ("empty handle", lambda d: _packed(d, handle="", alloc_id=f"/{d.ip}")),
    ("empty node", lambda d: _packed(d, node="")),
    ("block that is not a CIDR", lambda d: _packed(d, block="10.64.0.0/99")),
]


def test_malformed_decisions_are_counted_recorded_acked_and_the_rest_released(env: Env) -> None:
    leaked = _dead_node(env)
    good = _a_decision(env)
    for _name, forge in DECISIONS:
        data = forge(good)
        env.redis.xadd(env.keys.decisions, {"id": good.alloc_id} if data is None else {"id": "x", "d": data})
    lead = env.leader()
    lead.step()
    errors = [r for r in env.audit() if r.result is Result.ERROR]
    assert lead.stats.malformed == len(DECISIONS) == len(errors)
    assert all(r.reason.startswith("malformed decision") and r.decision for r in errors)
    assert {r.ip for r in env.audit() if r.result is Result.RELEASED and r.ip} == leaked
    assert env.pending() == 0
    assert env.sim.truth.violations == []


def test_an_allocation_record_for_a_block_that_does_not_exist_releases_nothing(env: Env) -> None:
    env.sim.add_node("node-a")
    env.decide()
    handle, ip, block = "k8s-pod-network.ghost", "10.250.0.5", "10.250.0.0/26"
    alloc_id = allocation_id(handle, ip)
    shard = shard_of("node-a")
    record = msgpack.packb([1, block, 5, 0, {"node": "node-a", "namespace": "ns", "pod": "ghost"}])
    env.redis.hset(env.keys.alloc(shard), alloc_id, record)
    add_handle_field(env.redis, env.keys, handle, handle_field(alloc_id), "node-a")
    env.redis.sadd(env.keys.dirty(shard), alloc_id)
    env.validate([shard])  # a candidate on a live node: confirmed after the grace period
    env.clock.advance(10_000)
    env.redis.sadd(env.keys.dirty(shard), alloc_id)
    env.validate([shard])
    env.server.clear_requests()
    lead = env.leader()
    lead.step()
    [outcome] = [r for r in env.audit() if r.ip == ip]
    assert outcome.result is Result.ALREADY_FREE and "block not found" in outcome.reason
    assert env.writes() == []


def test_a_handle_index_field_that_is_not_text_holds_its_handle(env: Env) -> None:
    leaked = _dead_node(env)
    held = next(d for d in _decisions(env) if d.ip in leaked)
    # a member in the handle's range whose field is not text (msgpack bin, not str)
    forged = pack(held.handle) + pack(b"\xff\xfe") + pack("node-dead")
    env.redis.zadd(env.keys.handles, {forged: 0})
    lead = env.leader()
    lead.step()
    results = {r.ip: r.result for r in env.audit() if r.ip}
    assert results[held.ip] is Result.HELD_BY_HANDLE
    assert {ip for ip, res in results.items() if res is Result.RELEASED} == leaked - {held.ip}
    assert env.sim.truth.violations == []


MALFORMED_HANDLE_SPECS = [
    {"handleID": "x", "block": {"10.64.0.0/26": "two"}},
    {"handleID": "x", "block": ["10.64.0.0/26"]},
    "nope",
]


@pytest.mark.parametrize(
    "spec", MALFORMED_HANDLE_SPECS, ids=["count not a number", "block a list", "spec a string"]
)
def test_a_malformed_ipam_handle_holds_its_ips_and_the_rest_is_released(env: Env, spec: object) -> None:
    """All-or-none is checked on the live IPAMHandle: one that cannot be read cannot vouch for its IPs,
    which wait (an error in the audit); the other handles' leaks go."""
    leaked = _dead_node(env)
    pod = next(d for d in _decisions(env) if d.handle.startswith("k8s-pod-network."))
    obj = env.server.store.get("ipamhandles", None, pod.handle.lower())
    obj["spec"] = spec
    env.server.store.replace("ipamhandles", None, pod.handle.lower(), obj)
    env.server.clear_requests()
    lead = env.leader()
    lead.step()
    results = {r.ip: r for r in env.audit() if r.ip}
    assert results[pod.ip].result is Result.ERROR and "handle not readable" in results[pod.ip].reason
    assert {ip for ip, r in results.items() if r.result is Result.RELEASED} == leaked - {pod.ip}
    assert env.sim.truth.violations == []
    assert not [w for w in env.writes() if w.resource == "ipamhandles" and w.name == pod.handle.lower()]


@pytest.mark.parametrize(
    "spec", MALFORMED_HANDLE_SPECS, ids=["count not a number", "block a list", "spec a string"]
)
def test_a_handle_malformed_after_its_block_was_written_is_left_alone(env: Env, spec: object) -> None:
    """The decrement after a block write reads the handle again: malformed now, it is left as it is (a
    MalformedObject the releaser logs), never a crash of the pass."""
    _dead_node(env)
    pod = next(d for d in _decisions(env) if d.handle.startswith("k8s-pod-network."))
    obj = env.server.store.get("ipamhandles", None, pod.handle.lower())
    obj["spec"] = spec
    env.server.store.replace("ipamhandles", None, pod.handle.lower(), obj)
    api = env.api("decrementer")
    with pytest.raises(MalformedObject):
        decrement_handle(api, pod.handle, pod.block, 1)
    BlockReleaser(api, lambda: None)._decrement_handles(pod.block, {pod.handle: 1})  # logged, not raised
    assert env.server.store.get("ipamhandles", None, pod.handle.lower())["spec"] == spec


def test_a_blockaffinity_with_a_bad_cidr_holds_its_node_and_nothing_else(env: Env) -> None:
    leaked = _dead_node(env)
    [aff] = [
        a for a in env.server.store.list("blockaffinities")["items"] if a["spec"]["node"] == "node-dead"
    ][:1]
    aff["spec"]["cidr"] = "10.64.0.0/99"
    env.server.store.replace("blockaffinities", None, aff["metadata"]["name"], aff)
    lead = env.leader()
    lead.step()
    assert {r.ip for r in env.audit() if r.result is Result.RELEASED and r.ip} == leaked
    errors = [r for r in env.audit() if r.node == "node-dead" and not r.ip and r.result is Result.ERROR]
    assert errors and "bad-cidr" in errors[0].reason
    assert env.server.store.get("blockaffinities", None, aff["metadata"]["name"])  # kept


def test_garbage_in_the_leaders_own_keys_is_survived(env: Env) -> None:
    """An empty-block timer that is not a number restarts; a block key that is not a CIDR, and a
    dirty-block member that is not text, name no block."""
    env.sim.add_node("node-a")
    spare = env.sim.empty_block("node-a")
    env.decide()
    env.redis.hset(env.keys.emptyblocks, spare, "soon")
    env.redis.hset(env.keys.blocks, "not-a-cidr", env.redis.hget(env.keys.blocks, spare) or b"")
    env.redis.hset(env.keys.blocks, b"\xff\xfe", b"junk")
    env.redis.sadd(env.keys.dirtyblocks(0), b"\xff\xfe", "not-a-cidr")
    lead = env.leader()
    lead.step()  # the unreadable timer restarts now
    assert float((env.redis.hget(env.keys.emptyblocks, spare) or b"0").split()[0]) == env.clock.now()
    env.clock.advance(10_000)
    lead._next_empty = lead._next_cleanup = float("-inf")
    lead.step()
    assert any(r.block == spare and r.result is Result.RELEASED for r in env.audit())
    with pytest.raises(Exception, match="not found"):
        env.server.store.get("ipamblocks", None, cidr_to_name(spare))


def _decisions(env: Env) -> list[Decision]:
    return [decode_decision(f[b"d"]) for _, f in env.redis.xrange(env.keys.decisions)]
