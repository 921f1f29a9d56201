"""Malformed entries in Redis (corrupt or forged), for each reader: the shard job, the watcher's mirror and
the leader.  Each is logged with the entry's identity, counted where the component counts, and skipped
(or taken for what keeps the IP); the component goes on with the next entry in the same pass; and no
release is ever decided from one of them."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import msgpack
import pytest
import redis

from lab.cluster.objects import ClusterBuilder
from producer.mirror import Mirror
from producer.relist import Kind
from shared import keys as k
from shared.clock import FakeClock
from shared.gcrecords import decode_decision
from shared.keys import Keys, pod_key
from shared.parse import parse_block, parse_node, parse_pod
from shared.shard import DEFAULT_SHARDS, shard_of
from workers.shards.validate import ShardStats, validate_shard

GRACE = 60.0
NODE = "node-1"


@dataclass
class World:
    client: redis.Redis
    keys: Keys
    clock: FakeClock
    mirror: Mirror
    builder: ClusterBuilder
    handles: dict[str, tuple[str, list[str]]]

    @property
    def shard(self) -> int:
        return shard_of(NODE)

    def alloc_id(self, pod: str) -> str:
        handle, ips = self.handles[pod]
        return f"{handle}/{ips[0]}"

    def sync(self) -> None:
        b = self.builder
        self.mirror.relist(Kind.NODES, [parse_node(n) for n in b.nodes.values()])
        self.mirror.relist(Kind.PODS, [parse_pod(p) for p in b.pods.values()])
        self.mirror.relist(Kind.BLOCKS, [parse_block(x) for x in b.ipam.blocks.values()])

    def validate(self) -> ShardStats:
        total = ShardStats(self.shard)
        for s in range(DEFAULT_SHARDS):
            stats = validate_shard(s, client=self.client, keys=self.keys, clock=self.clock)
            for field in ("skipped_malformed", "unknown_lookups", "decisions", "validated"):
                setattr(total, field, getattr(total, field) + getattr(stats, field))
            total.gated |= stats.gated
        return total

    def decided(self) -> set[str]:
        return {decode_decision(f[b"d"]).alloc_id for _, f in self.client.xrange(self.keys.decisions)}

    def record(self, pod: str) -> bytes:
        raw = self.client.hget(self.keys.alloc(self.shard), self.alloc_id(pod))
        assert isinstance(raw, bytes)
        return raw


@pytest.fixture
def world(client: redis.Redis, keys: Keys, clock: FakeClock) -> Iterator[World]:
    """node-1 with pods `a` and `b` leaked (deleted without CNI DEL) and `live` in use, mirrored and
    validated once: `a` and `b` are candidates, confirmed by the next validation after the grace period."""
    b = ClusterBuilder()
    b.add_node(NODE)
    handles = {name: b.add_pod("default", name, NODE) for name in ("a", "b", "live")}
    mirror = Mirror(client, keys, clock=clock)
    mirror.set_config(GRACE, True)
    w = World(client, keys, clock, mirror, b, handles)
    w.sync()
    mirror.mark_synced()
    assert w.validate().decisions == 0
    for name in ("a", "b"):
        b.delete_pod("default", name, cni_del=False)
    w.sync()
    w.validate()
    w.clock.advance(GRACE + 1)
    yield w


def _dirty(w: World, *pods: str) -> None:
    w.client.sadd(w.keys.dirty(w.shard), *(w.alloc_id(p) for p in pods))


def _logged(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(
        r.getMessage() + " " + str(getattr(r, "alloc", getattr(r, "pod", ""))) for r in caplog.records
    )


# -- the shard job ------------------------------------------------------------------------------------------


@dataclass
class RecordCase:
    name: str
    corrupt: Callable[[bytes], bytes]


ALLOCATION_RECORDS = [
    RecordCase("allocation record: truncated msgpack", lambda good: good[: len(good) // 2]),
    RecordCase("allocation record: not msgpack", lambda good: b"\xc1\xc1 not msgpack"),
    RecordCase("allocation record: trailing bytes", lambda good: good + b"\x00"),
    RecordCase("allocation record: unknown version tag", lambda good: _retag(good, 7)),
    RecordCase("allocation record: wrong arity", lambda good: msgpack.packb(msgpack.unpackb(good)[:3])),
    RecordCase("allocation record: ordinal of the wrong type", lambda good: _field(good, 2, "five")),
    RecordCase("allocation record: attributes not strings", lambda good: _field(good, 4, {"node": 1})),
    RecordCase("allocation record: not an array", lambda good: msgpack.packb({"v": 1})),
]


def _retag(good: bytes, tag: object) -> bytes:
    v = msgpack.unpackb(good)
    v[0] = tag
    return bytes(msgpack.packb(v))


def _field(good: bytes, index: int, value: object) -> bytes:
    v = msgpack.unpackb(good)
    v[index] = value
    return bytes(msgpack.packb(v))


@pytest.mark.parametrize("case", ALLOCATION_RECORDS, ids=lambda c: c.name)
def test_a_malformed_allocation_record_is_skipped_and_never_decided(
    world: World, case: RecordCase, caplog: pytest.LogCaptureFixture
) -> None:
    w = world
    w.client.hset(w.keys.alloc(w.shard), w.alloc_id("a"), case.corrupt(w.record("a")))
    _dirty(w, "a", "b")
    stats = w.validate()
    assert stats.skipped_malformed == 1
    assert w.alloc_id("a") in _logged(caplog)
    assert w.decided() == {w.alloc_id("b")}  # the next (good) allocation of the same batch is decided


def test_a_malformed_pod_record_is_a_pod_that_may_exist(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    w = world
    for garbage in (
        b"not msgpack",
        msgpack.packb([1, "uid", "node-1", "Running", "", "10.0.0.1", "x", {}, False, False]),
    ):
        w.client.hset(w.keys.pods, pod_key("default", "a"), garbage)  # `a` was deleted: forged back
        _dirty(w, "a", "b")
        stats = w.validate()
        assert stats.unknown_lookups == 1
        assert "default/a" in _logged(caplog)
    assert w.decided() == {w.alloc_id("b")}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        (k.STATE_GRACE, b"fifteen minutes"),
        (k.STATE_GRACE, b"-1"),
        (k.STATE_GRACE, b"nan"),
        (k.STATE_GRACE, b"\xff\xfe"),
        (k.STATE_DATASTORE_READY, b"yes"),
        (k.STATE_SYNCED, b"\x00"),
    ],
)
def test_a_state_hash_with_garbage_gates_everything(
    world: World, field: str, value: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="workers.validate")
    w = world
    w.client.hset(w.keys.state, field, value)
    _dirty(w, "a", "b")
    stats = w.validate()
    assert stats.gated and stats.decisions == 0 and w.decided() == set()
    assert "shard job idle" in _logged(caplog)
    assert w.client.scard(w.keys.dirty(w.shard)) == 2  # nothing lost: validated once the state is fixed


def test_an_unreadable_candidate_timer_restarts_it(world: World, caplog: pytest.LogCaptureFixture) -> None:
    w = world
    w.client.hset(w.keys.cand(w.shard), w.alloc_id("a"), b"\x93\x01")  # truncated
    _dirty(w, "a", "b")
    w.validate()
    assert w.decided() == {w.alloc_id("b")}  # `a` starts its grace period again: later, never earlier
    assert "unreadable timer record" in _logged(caplog)
    w.clock.advance(GRACE + 1)
    _dirty(w, "a")
    w.validate()
    assert w.alloc_id("a") in w.decided()


def test_dirty_ids_that_are_not_allocation_ids_are_dropped(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    w = world
    junk = [b"\xff\xfe/10.0.0.1", b"no-slash", b"k8s-pod-network.x/not-an-ip", b""]
    w.client.sadd(w.keys.dirty(w.shard), *junk)
    _dirty(w, "a", "b")
    stats = w.validate()
    assert w.decided() == {w.alloc_id("a"), w.alloc_id("b")}
    assert stats.skipped_malformed >= 1  # the one that is not even text
    assert w.client.zcard(w.keys.inflight(w.shard)) == 0  # nothing left leased to come back forever
    assert w.client.scard(w.keys.dirty(w.shard)) == 0


def test_garbage_in_a_gone_nodes_index_does_not_stop_its_cleanup(world: World) -> None:
    w = world
    w.client.sadd(w.keys.nodeallocs(w.shard, NODE), b"\xff\xfe", b"junk")
    w.builder.delete_node(NODE, with_pods=True)
    w.sync()
    w.validate()
    assert {w.alloc_id(p) for p in ("a", "b", "live")} <= w.decided()


def test_a_garbage_node_record_keeps_a_deleted_node_alive(world: World) -> None:
    """An unreadable node record is a node that exists: nothing of it is confirmed at once."""
    w = world
    w.builder.delete_node(NODE, with_pods=True)
    w.sync()
    w.client.hset(w.keys.nodes, NODE, b"garbage")
    _dirty(w, "live")
    w.validate()
    assert w.alloc_id("live") not in w.decided()


# -- the watcher's mirror ---------------------------------------------------------------------------------


def _block_cidr(w: World) -> str:
    return next(iter(w.builder.ipam.blocks))


def _bump(w: World) -> None:
    for raw in w.builder.ipam.blocks.values():
        raw["metadata"]["resourceVersion"] = str(int(raw["metadata"].get("resourceVersion") or 0) + 1)


@pytest.mark.parametrize(
    "stored",
    [
        b"garbage",
        msgpack.packb([1, "1", "uid", "node-1", 1, {9999: ["h", 1, {"node": "node-1"}]}]),
        msgpack.packb([1, "1", "uid", "node-1", 1, {-1: ["h", 1, {"node": "node-1"}]}]),
        msgpack.packb([1, "1", "uid", "node-1", 1, {3: "not a slot"}]),
        msgpack.packb([9, "1"]),
    ],
    ids=["not msgpack", "ordinal past the block", "negative ordinal", "slot not a triple", "unknown version"],
)
def test_the_mirror_rebuilds_an_unreadable_block_record(
    world: World, stored: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    w = world
    cidr = _block_cidr(w)
    w.client.hset(w.keys.blocks, cidr, stored)
    before = w.mirror.stats.malformed
    _restart_watcher(w)  # the mirror reads its records back only when a watcher starts
    _bump(w)
    w.sync()  # the next event of that block (a relist here) rewrites it
    assert w.mirror.stats.malformed == before + 1
    assert cidr in _logged(caplog) or "stored block record unreadable" in _logged(caplog)
    assert w.client.hget(w.keys.blocks, cidr) != stored


def test_the_mirror_survives_garbage_field_names(world: World) -> None:
    """Fields that are not UTF-8, a pod key without a namespace, a block key that is not a CIDR (with a
    readable record under it): a relist of each kind goes through."""
    w = world
    good_block = w.client.hget(w.keys.blocks, _block_cidr(w))
    w.client.hset(w.keys.pods, b"\xff\xfe/x", b"x")
    w.client.hset(w.keys.pods, "no-namespace", b"x")
    w.client.hset(w.keys.nodes, b"\xff\xfe", b"x")
    w.client.hset(w.keys.blocks, b"\xff\xfe", b"x")
    w.client.hset(w.keys.blocks, "not-a-cidr", good_block or b"")
    w.builder.add_pod("default", "after", NODE)
    w.sync()
    assert w.client.hexists(w.keys.pods, pod_key("default", "after"))


@pytest.mark.parametrize(
    "entry",
    [b"not msgpack", msgpack.packb([1]), b""],
    ids=["not msgpack", "not a record", "empty"],
)
def test_a_garbage_stored_pod_record_is_rewritten_and_its_allocations_dirtied(
    world: World, entry: bytes
) -> None:
    """The pod → allocations index lives in the watcher's memory now (no `podallocs` hash to forge); what
    a restarted watcher reads back is the pod records: a forged one differs from the listed pod, so the
    relist rewrites it and re-validates the pod's allocations (never trusts it)."""
    w = world
    w.client.hset(w.keys.pods, pod_key("default", "live"), entry)
    _restart_watcher(w)
    for s in range(DEFAULT_SHARDS):
        w.client.delete(w.keys.dirty(s))
    w.sync()
    assert w.client.hget(w.keys.pods, pod_key("default", "live")) not in (None, entry)
    dirty = {m.decode() for m in w.client.smembers(w.keys.dirty(w.shard))}
    assert w.alloc_id("live") in dirty
    w.builder.add_pod("default", "next", NODE)
    w.sync()  # and the next pod event goes through
    assert w.client.hexists(w.keys.pods, pod_key("default", "next"))


def _restart_watcher(w: World) -> None:
    """A new watcher process: its memory of the mirror is rebuilt from Redis at its first call."""
    w.mirror.memory.clear()


def test_records_bytes_survive_logging(world: World, caplog: pytest.LogCaptureFixture) -> None:
    """A record with non-UTF-8 strings inside is a RecordError, not a crash (msgpack raw=False)."""
    caplog.set_level(logging.WARNING)
    w = world
    w.client.hset(w.keys.alloc(w.shard), w.alloc_id("a"), b"\x95\x01\xa3\xff\xfe\xfd\x00\x00\x80")
    _dirty(w, "a", "b")
    assert w.validate().skipped_malformed == 1
    assert w.decided() == {w.alloc_id("b")}
