"""Calico's per-(pool, node) IPAM gauges, kept incrementally as the mirror sees blocks change.

Why a module: Calico 3.26 recomputed its IPAM metrics from every allocation after every sync, part of the
#7841 cost; here nothing is recomputed per event.  `BlockTally` keeps, per block CIDR, what the block
contributes (allocations per `node` attribute, borrowed ones, its host) and the totals per (pool, node).
The mirror calls `observe_counts` for every block it is given (unchanged ones too, so a relist, the first
thing a new active watcher does, brings the tally up to date after a fail-over), and an update costs the
size of that one block.  Blocks map to IPPools by CIDR containment (`producer/ippools.py`); the pools
change rarely and regroup the tally in O(blocks) when they do.  The mirror's thread writes, the metrics'
threads read: every access is under one lock.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from producer.ippools import IPPool, pool_of_block
from shared import metrics_names as m
from shared.blockrecords import BlockRecord

PoolNode = tuple[str, str]


@dataclass(frozen=True, slots=True)
class BlockFacts:
    """What one block contributes to Calico's gauges."""

    host: str | None
    in_use: Mapping[str, int]  # `node` attribute (or unknown_node) → allocations
    borrowed: Mapping[str, int]  # known `node` attribute ≠ host → allocations

    @classmethod
    def of(cls, rec: BlockRecord) -> BlockFacts:
        return cls.counted(rec.host, Counter(slot.attrs.get("node", "") for slot in rec.slots.values()))

    @classmethod
    def counted(cls, host: str | None, nodes: Mapping[str, int]) -> BlockFacts:
        """From a block's allocations per `node` attribute ("" for none)."""
        in_use = dict(nodes)
        borrowed = {n: c for n, c in in_use.items() if n and n != host}
        if "" in in_use:
            in_use[m.UNKNOWN_NODE] = in_use.get(m.UNKNOWN_NODE, 0) + in_use.pop("")
        return cls(host, in_use, borrowed)


@dataclass(frozen=True, slots=True)
class Totals:
    pools: tuple[IPPool, ...]
    in_use: dict[PoolNode, int]
    borrowed: dict[PoolNode, int]
    blocks: dict[PoolNode, int]


class BlockTally:
    """Totals of Calico's per-(pool, node) gauges, updated by the blocks that change (thread-safe)."""

    def __init__(self, pools: Iterable[IPPool] = ()) -> None:
        self._lock = threading.Lock()
        self._pools = tuple(sorted(pools))
        self._facts: dict[str, BlockFacts] = {}
        self._pool: dict[str, str] = {}
        # What `observe_counts` was last told of each block: most blocks a batch sees did not change their
        # counts (an update of an attribute, a re-list), and comparing two small dicts in C is cheaper
        # than building the block's facts to find that out.
        self._counts: dict[str, tuple[str | None, dict[str, int]]] = {}
        self._in_use: Counter[PoolNode] = Counter()
        self._borrowed: Counter[PoolNode] = Counter()
        self._blocks: Counter[PoolNode] = Counter()

    def observe(self, cidr: str, rec: BlockRecord | None) -> None:
        """The block `cidr` is now `rec` (None: gone)."""
        facts = BlockFacts.of(rec) if rec is not None else None
        with self._lock:
            self._counts.pop(cidr, None)
            self._observe(cidr, facts)

    def observe_counts(self, cidr: str, host: str | None, nodes: Mapping[str, int] | None) -> None:
        """The block `cidr` now has `host` and these allocations per node (None: gone).  The mirror calls
        this for every block it sees."""
        seen = (host, dict(nodes)) if nodes is not None else None
        with self._lock:
            if seen is None:
                self._counts.pop(cidr, None)
                self._observe(cidr, None)
            elif self._counts.get(cidr) != seen:
                self._counts[cidr] = seen
                self._observe(cidr, BlockFacts.counted(host, seen[1]))

    def _observe(self, cidr: str, facts: BlockFacts | None) -> None:
        """Under `_lock`."""
        old = self._facts.get(cidr)
        if old == facts:
            return
        pool = None
        if old is not None:
            pool = self._pool.pop(cidr)
            self._add(pool, old, -1)
            del self._facts[cidr]
        if facts is not None:
            # A block's pool changes only with the pools (`set_pools` regroups every block).
            pool = pool if pool is not None else pool_of_block(cidr, self._pools)
            self._facts[cidr] = facts
            self._pool[cidr] = pool
            self._add(pool, facts, 1)

    def set_pools(self, pools: Iterable[IPPool]) -> bool:
        """Regroup every block under the current pools (O(blocks)); False when they did not change."""
        fresh = tuple(sorted(pools))
        with self._lock:
            if fresh == self._pools:
                return False
            self._pools = fresh
            self._in_use.clear()
            self._borrowed.clear()
            self._blocks.clear()
            for cidr, facts in self._facts.items():
                pool = self._pool[cidr] = pool_of_block(cidr, fresh)
                self._add(pool, facts, 1)
            return True

    def _add(self, pool: str, facts: BlockFacts, sign: int) -> None:
        for counter, values in ((self._in_use, facts.in_use), (self._borrowed, facts.borrowed)):
            for node, n in values.items():
                _bump(counter, (pool, node), sign * n)
        _bump(self._blocks, (pool, facts.host or m.NO_AFFINITY), sign)

    def totals(self) -> Totals:
        with self._lock:
            return Totals(self._pools, dict(self._in_use), dict(self._borrowed), dict(self._blocks))

    def nodes(self) -> set[str]:
        """Nodes that still own a block or are named by an allocation."""
        with self._lock:
            return {n for _, n in self._in_use} | {n for _, n in self._blocks}


def _bump(counter: Counter[PoolNode], key: PoolNode, n: int) -> None:
    value = counter[key] + n
    if value:
        counter[key] = value
    else:
        del counter[key]
