"""One batch of mirror writes, merged per key, sent as one pipeline in an order that survives a crash.

Why a module of its own: the watcher's cost per event was dominated by one Redis command per fact (11
commands per pod event for the mirror alone).  Here every write of a batch is gathered first, so each key
gets one command per batch (one multi-field HSET per hash, one SADD per set), a later write of the same
field cancels an earlier opposite one (HDEL then HSET of one field is one HSET), and the pipeline runs in
this order:

1. index removals, then index and record writes (`alloc:{s}`, `nodeallocs`, `nodeblocks`, `handles`);
2. leak timers dropped (an allocation that changed or vanished restarts, #12839);
3. the dirty ids (SADD per shard) and `dirtyblocks`;
4. the bases the next diff is taken against when the watcher restarts (`blocks`, `pods`, `nodes`), and
   the empty-block index (`empty`);
5. `P:state.generation` incremented (`producer/generation.py`: how the watcher notices lost writes);
6. a `pulses` entry and each armed shard's `queued` flag (SET NX, `redisio.shardqueue.queue.arm_in`),
   whose replies say which shards need a job; none while the workers' gate is closed (listing, datastore
   not ready): opening it kicks.
A batch cut off half-way (connection lost) has written its dirty ids before the bases that would hide the
change from a re-diff, so reloading and applying the batch again loses nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

import redis

from producer.redis_scripts import ProducerScripts
from redisio import luapipe
from redisio.heldconn import HeldConnection
from redisio.shardqueue.queue import arm_in
from shared.keys import PULSES_MAXLEN, STATE_GENERATION, Keys, pulse_fields


class Writes:
    """Accumulates one batch (see the module docstring); `execute` returns the newly armed shards."""

    def __init__(self, keys: Keys, scripts: ProducerScripts) -> None:
        self.keys = keys
        self.scripts = scripts
        self._hset: dict[str, dict[str, bytes | str]] = {}
        self._hdel: dict[str, set[str]] = {}
        self._sadd: dict[str, set[str]] = {}
        self._srem: dict[str, set[str]] = {}
        self._zadd: dict[str, set[bytes]] = {}  # ZSET members at score 0 (the handle index)
        self._zrem: dict[str, set[bytes]] = {}
        self._base_hset: dict[str, dict[str, bytes | str]] = {}
        self._base_hdel: dict[str, set[str]] = {}
        self.dirty: dict[int, set[str]] = {}
        self.dirty_blocks: dict[int, set[str]] = {}
        self.timers: dict[int, set[str]] = {}
        # (shard, node): every id of the node's `nodeallocs` set made dirty server-side (node add/delete:
        # the set in Redis is what the workers judge a gone node on, so it is what is re-validated).
        self.dirty_node_sets: list[tuple[int, str]] = []
        self.generation: int | None = None  # `P:state.generation` as this batch's write left it

    # -- gathering ---------------------------------------------------------------------------------------

    def hset(self, key: str, name: str, value: bytes | str) -> None:
        _put(self._hset, self._hdel, key, name, value)

    def hdel(self, key: str, name: str) -> None:
        _drop(self._hset, self._hdel, key, name)

    def sadd(self, key: str, member: str) -> None:
        _move(self._sadd, self._srem, key, member)

    def srem(self, key: str, member: str) -> None:
        _move(self._srem, self._sadd, key, member)

    def zadd(self, key: str, member: bytes) -> None:
        _move(self._zadd, self._zrem, key, member)

    def zrem(self, key: str, member: bytes) -> None:
        _move(self._zrem, self._zadd, key, member)

    def base_set(self, key: str, name: str, value: bytes | str) -> None:
        _put(self._base_hset, self._base_hdel, key, name, value)

    def base_del(self, key: str, name: str) -> None:
        _drop(self._base_hset, self._base_hdel, key, name)

    def mark_dirty(self, shard: int, ids: Iterable[str]) -> None:
        self.dirty.setdefault(shard, set()).update(ids)

    def drop_timers(self, shard: int, alloc_id: str) -> None:
        self.timers.setdefault(shard, set()).add(alloc_id)

    def empty(self) -> bool:
        return not (
            self._hset
            or self._hdel
            or self._sadd
            or self._srem
            or self._zadd
            or self._zrem
            or self._base_hset
            or self._base_hdel
            or any(self.dirty.values())
            or self.dirty_blocks
            or self.timers
            or self.dirty_node_sets
        )

    # -- sending -----------------------------------------------------------------------------------------

    def execute(
        self,
        client: redis.Redis,
        queued_ttl_ms: int,
        *,
        arm: bool = True,
        held: HeldConnection | None = None,
        defer_dirty: bool = False,
    ) -> tuple[int, list[int]]:
        """Send the batch; returns (ids newly made dirty, shards whose `queued` flag this batch set).
        `arm=False` (the workers' gate is closed): no pulse, no flags; the ids wait in `dirty`.
        `defer_dirty` (a watcher's first list on a Redis not marked synced, gate closed): no dirty id is
        written, the pass over every allocation the gate's opening starts covers them (`P:revalidate:{s}`,
        `shared/keys.py`); the count returned is of the ids it covers."""
        if self.empty():
            return 0, []
        pipe = client.pipeline(transaction=False)
        for key, names in sorted(self._hdel.items()):
            if names:
                pipe.hdel(key, *sorted(names))
        for key, members in sorted(self._srem.items()):
            if members:
                pipe.srem(key, *sorted(members))
        for key, zmembers in sorted(self._zrem.items()):
            for chunk in _chunks(sorted(zmembers)):
                pipe.zrem(key, *chunk)
        for key, mapping in sorted(self._hset.items()):
            for part in _hset_parts(mapping):
                pipe.hset(key, mapping=part)  # type: ignore[arg-type]
        for key, members in sorted(self._sadd.items()):
            if members:
                pipe.sadd(key, *sorted(members))
        for key, zmembers in sorted(self._zadd.items()):
            for chunk in _chunks(sorted(zmembers)):
                pipe.zadd(key, dict.fromkeys(chunk, 0))
        for shard, ids in sorted(self.timers.items()):
            order = sorted(ids)
            pipe.hdel(self.keys.cand(shard), *order)
            pipe.zrem(self.keys.due(shard), *order)
            pipe.hdel(self.keys.decided(shard), *order)
        counted: list[int] = []
        armed = sorted(s for s, ids in self.dirty.items() if ids)
        deferred = 0
        if defer_dirty:
            deferred = sum(len(ids) for ids in self.dirty.values())
            armed = []
        for shard in armed:
            counted.append(len(pipe))
            pipe.sadd(self.keys.dirty(shard), *sorted(self.dirty[shard]))
        for shard, node in [] if defer_dirty else self.dirty_node_sets:
            counted.append(len(pipe))
            keys = [self.keys.dirty(shard), self.keys.nodeallocs(shard, node)]
            luapipe.add(pipe, self.scripts.dirty_from_set, keys, [])
            if shard not in armed:
                armed.append(shard)
        armed.sort()
        if not arm:
            armed = []
        for shard, cidrs in sorted(self.dirty_blocks.items()):
            pipe.sadd(self.keys.dirtyblocks(shard), *sorted(cidrs))
        for key, names in sorted(self._base_hdel.items()):
            if names:
                pipe.hdel(key, *sorted(names))
        for key, mapping in sorted(self._base_hset.items()):
            for part in _hset_parts(mapping):
                pipe.hset(key, mapping=part)  # type: ignore[arg-type]
        generation_at = len(pipe)
        pipe.hincrby(self.keys.state, STATE_GENERATION, 1)  # producer/generation.py
        if armed:
            pulse: dict[Any, Any] = pulse_fields(armed)  # redis-py's field type is a dict of unions
            pipe.xadd(self.keys.pulses, pulse, maxlen=PULSES_MAXLEN, approximate=False)
        for shard in armed:
            arm_in(pipe, self.keys, shard, queued_ttl_ms)
        results = luapipe.execute(pipe, client, [self.scripts.dirty_from_set], held)
        published = deferred + sum(int(results[i]) for i in counted)
        self.generation = int(results[generation_at])
        flags = results[len(results) - len(armed) :] if armed else []
        return published, [s for s, flag in zip(armed, flags, strict=True) if flag]


_Fields = dict[str, dict[str, bytes | str]]
_M = TypeVar("_M", str, bytes)

# Members per ZADD/ZREM: a cold start's batch would otherwise be one command of ~150,000 members, a
# multi-MB request that stalls Redis for its other clients while it runs.
ZSET_CHUNK = 10_000


def _chunks(members: list[bytes]) -> list[list[bytes]]:
    return [members[i : i + ZSET_CHUNK] for i in range(0, len(members), ZSET_CHUNK)]


# Bytes of field names and values per HSET.  hiredis packs a command in time that grows faster than its size
# (`hiredis.pack_command`, 3.5.0, on these machines: 10 values of 8 KB 14 and 188 µs in two runs, 50 of
# them 975–1,250 µs in five, where redis-py's pure-Python packer took 142 µs), and a batch's `blocks` base
# holds every changed block's packed record (8.1 KB for a /26 holding 51 IPs): at 50 pod events/s, ~57
# block events a second, a batch's one HSET could reach ~450 KB, and its packing was ~8 % of the
# watcher's py-spy samples.  Commands of at most this size pack in linear time;
# the few more commands a batch sends (one per 64 KB) are cheap next to that.
HSET_CHUNK_BYTES = 64 * 1024


def _hset_parts(mapping: dict[str, bytes | str]) -> list[dict[str, bytes | str]]:
    """`mapping` cut into HSETs of at most `HSET_CHUNK_BYTES` (a larger single field goes alone)."""
    parts: list[dict[str, bytes | str]] = []
    part: dict[str, bytes | str] = {}
    size = 0
    for name, value in mapping.items():
        n = len(name) + len(value)
        if part and size + n > HSET_CHUNK_BYTES:
            parts.append(part)
            part, size = {}, 0
        part[name] = value
        size += n
    if part:
        parts.append(part)
    return parts


def _put(sets: _Fields, dels: dict[str, set[str]], key: str, name: str, value: bytes | str) -> None:
    """HSET `key` `name`: cancels an HDEL of the same field gathered earlier in the batch."""
    _discard(dels, key, name)
    sets.setdefault(key, {})[name] = value


def _drop(sets: _Fields, dels: dict[str, set[str]], key: str, name: str) -> None:
    """HDEL `key` `name`: cancels an HSET of the same field gathered earlier in the batch."""
    fields = sets.get(key)
    if fields is not None:
        fields.pop(name, None)
    dels.setdefault(key, set()).add(name)


def _move(into: dict[str, set[_M]], out_of: dict[str, set[_M]], key: str, member: _M) -> None:
    """Gather `member` for `into` (SADD/ZADD, SREM/ZREM), cancelling the opposite gathered earlier."""
    _discard(out_of, key, member)
    into.setdefault(key, set()).add(member)


def _discard(table: dict[str, set[_M]], key: str, member: _M) -> None:
    members = table.get(key)
    if members is not None:
        members.discard(member)
