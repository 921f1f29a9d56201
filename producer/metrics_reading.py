"""What a metrics refresh reads from Redis: queue depths, node names, the other processes' counters.

Why a module: it is the one Redis read of the metrics, made every `interval` only while this replica leads,
in one pipeline: shard depths, node names (Calico's zero pre-seeding), the counters that worker processes
and the leader keep there (`P:metrics`, `P:reclaimed`), the last full resync, and the candidates
(`cand:{s}`, scanned, with their nodes from `alloc:{s}`): O(candidates), which Calico expects to stay near
zero; and Redis's own memory (`INFO memory`: `used_memory`, `maxmemory`), so that an alert fires before a
bounded Redis refuses writes (docs/runbooks.md#ipamgcredismemoryhigh).  The result (`Reading`) is mapped
to the labels it is exposed with, so that scrapes read only memory.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import redis

from producer.ippools import IPPool, pool_of_block, pool_of_ip
from producer.tally import PoolNode
from shared import metrics_names as m
from shared.codec import RecordError
from shared.keys import STATE_LAST_FULL_RESYNC, Keys
from shared.records import decode_allocation


@dataclass(slots=True)
class Reading:
    """One refresh: Redis state and the pools, mapped to the labels they are exposed with."""

    at: float
    seconds: float
    pools: tuple[IPPool, ...]
    nodes: frozenset[str]
    # shard → (dirty, inflight, candidates, due, allocations a pending revalidation pass covers)
    shards: dict[str, tuple[int, int, int, int, int]]
    candidates: dict[PoolNode, int]
    reclaimed: dict[PoolNode, int]
    counters: dict[str, float]
    last_full_resync: float | None
    used_memory: int = 0  # Redis's `used_memory`, bytes
    maxmemory: int = 0  # Redis's `maxmemory`, bytes (0: unbounded)


def text_of(raw: object) -> str:
    return raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)


def read_redis(
    client: redis.Redis, keys: Keys, shards: int, pools: tuple[IPPool, ...], chunk: int = 1000
) -> Reading:
    """Everything the refresh needs from Redis (pools map candidates and reclamations to their labels)."""
    started = time.monotonic()
    pipe = client.pipeline(transaction=False)
    for s in range(shards):
        pipe.scard(keys.dirty(s))
        pipe.zcard(keys.inflight(s))
        pipe.hlen(keys.cand(s))
        pipe.zcard(keys.due(s))
        pipe.exists(keys.revalidate(s))
        pipe.hlen(keys.alloc(s))
    pipe.hkeys(keys.nodes)
    pipe.hgetall(keys.metrics)
    pipe.hgetall(keys.reclaimed)
    pipe.hget(keys.state, STATE_LAST_FULL_RESYNC)
    pipe.info("memory")
    *depths, nodes, counters, reclaimed, resync, memory = pipe.execute()
    by_shard: dict[str, tuple[int, int, int, int, int]] = {}
    for s in range(shards):
        dirty, inflight, cand, due, passing, held = (int(x) for x in depths[6 * s : 6 * s + 6])
        # A pending pass over every allocation covers the shard's allocations: what is left of it is at
        # most that (the backlog autoscaling adds it to the dirty ids, as the dirty set held it before).
        by_shard[str(s)] = (dirty, inflight, cand, due, held if passing else 0)
    candidates: Counter[PoolNode] = Counter()
    for s in range(shards):
        if by_shard[str(s)][2]:
            for ip, node in _candidates(client, keys, s, chunk):
                candidates[(pool_of_ip(ip, pools), node)] += 1
    reclaims: Counter[PoolNode] = Counter()
    for f, v in reclaimed.items():
        block, _, node = text_of(f).partition("|")
        reclaims[(pool_of_block(block, pools), node)] += int(v)
    values: dict[str, float] = {}
    for f, v in counters.items():
        with contextlib.suppress(ValueError):
            values[text_of(f)] = float(v)
    last = None
    with contextlib.suppress(TypeError, ValueError):
        last = float(resync) if resync is not None else None
    return Reading(
        at=time.time(),
        seconds=time.monotonic() - started,
        pools=pools,
        nodes=_node_names(tuple(nodes)),
        shards=by_shard,
        candidates=dict(candidates),
        reclaimed=dict(reclaims),
        counters=values,
        last_full_resync=last,
        used_memory=_int_of(memory, "used_memory"),
        maxmemory=_int_of(memory, "maxmemory"),
    )


@functools.lru_cache(maxsize=1)
def _node_names(raw: tuple[object, ...]) -> frozenset[str]:
    """The node names, decoded once while they do not change (3,000 nodes: 4 ms a refresh otherwise)."""
    return frozenset(text_of(n) for n in raw)


def _int_of(info: object, field: str) -> int:
    """A field of a parsed INFO section, 0 when absent or not a number."""
    if not isinstance(info, dict):
        return 0
    try:
        return int(info.get(field, 0))
    except (TypeError, ValueError):
        return 0


def _candidates(client: redis.Redis, keys: Keys, shard: int, chunk: int) -> Iterator[tuple[str, str]]:
    """(ip, node attribute) of every candidate or confirmed leak of a shard (HSCAN, then HMGET chunks)."""
    ids: list[str] = []
    for f, _ in client.hscan_iter(keys.cand(shard), count=chunk):
        ids.append(text_of(f))
    for i in range(0, len(ids), chunk):
        part = ids[i : i + chunk]
        for alloc_id, raw in zip(part, client.hmget(keys.alloc(shard), part), strict=True):
            if not isinstance(raw, bytes):
                continue  # vanished since: its timer goes with it
            try:
                a = decode_allocation(alloc_id, raw)
            except RecordError:
                continue  # logged where it matters (the worker skips it too)
            yield a.ip, a.node or m.UNKNOWN_NODE
