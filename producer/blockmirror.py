"""The mirror's blocks: `P:blocks` as the watcher writes it, each block event diffed against its memory.

Why a module: of the kinds the mirror keeps, blocks are the one whose events carry the allocations, and
their apply path is the watcher's hot path.  A batch of block events (the newest state of each block, None
when it is gone) is applied in chunks of at most `Mirror.chunk` blocks holding at most `Mirror.chunk` ×
`ALLOCATIONS_PER_OBJECT` allocations (`chunks`): each chunk is one `Writes`, each changed block is
diffed by `BlockDiff` (`producer/blockdiff.py`: what its allocations' appearing, changing and vanishing
write and dirty) and its packed record written or removed, and a node that lost an allocation and is gone
has what is left on it re-validated.  Every block given is told to the block observer (the metrics' tally),
changed or not; a block whose changed attributes do not decode is refused as the generic path refuses an
object it cannot read: not mirrored, so none of its IPs is released on the strength of it.  The pod and
node paths stay in `producer/mirror.py`, whose narrow interface it declares here rather than import the
module that imports it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Protocol

from producer.blockdiff import BlockDiff
from producer.memory import HeldBlock, Memory
from producer.slim import BadAttribute, lean_of
from producer.writes import Writes
from shared.blockrecords import LeanBlock, MirroredBlock, encode_block_packed
from shared.clock import Clock
from shared.keys import Keys
from shared.model import IPAMBlock

__all__ = ["BlockMirror"]

log = logging.getLogger("producer.mirror")  # the name its lines had before the module was split

# A chunk of blocks holds at most `Mirror.chunk` × this many allocations.  A block carries up to 64 (a /26)
# where a pod carries one or two, and a chunk is one pipeline whose writes (each allocation's record, index
# entries and dirty id) are gathered, then packed, then read by Redis whole: 500 blocks of a list page were
# ~25,000 allocations (51 a block in the benchmark), ~14 MB packed at once and as much again gathered, the
# watcher's peak at a cold start (docs/benchmarks.md, "A cold start's peak").  At 8 a chunk of full /26
# blocks is ~62 of them, and a cold start of 150,000 pods ~40 pipelines instead of 6.
ALLOCATIONS_PER_OBJECT = 8


class Mirror(Protocol):
    """`producer.mirror.Mirror` as the block path uses it: its settings, its memory, its batch writes and
    their send, the nodes events touched, and the callbacks the watcher and its metrics set."""

    keys: Keys
    shards: int
    chunk: int
    clock: Clock
    touched_nodes: set[str]
    block_observer: Callable[[str, str | None, Mapping[str, int] | None], None] | None
    on_malformed_block: Callable[[], None]

    def _memory(self) -> Memory: ...

    def _writes(self) -> Writes: ...

    def _send(self, writes: Writes) -> int: ...


class BlockMirror:
    """`P:blocks`, kept by the publisher (see the module docstring)."""

    def __init__(self, mirror: Mirror) -> None:
        self.mirror = mirror

    def apply(self, latest: Mapping[str, IPAMBlock | MirroredBlock | None]) -> int:
        """The newest state of each block (None: gone), chunk by chunk.  Returns dirty ids published."""
        return sum(self._chunk(c) for c in chunks(latest, self.mirror.chunk))

    def _chunk(self, items: list[tuple[str, IPAMBlock | MirroredBlock | None]]) -> int:
        m = self.mirror
        mem = m._memory()
        writes = m._writes()
        vanished_on: dict[str, int] = {}  # node → shard, for nodes that lost an allocation
        diff = BlockDiff(m.keys, m.shards, mem, writes, vanished_on, m.touched_nodes)
        now = m.clock.now()
        for cidr, new in items:
            old = mem.blocks.get(cidr)
            rec = None if new is None else _lean_of(new)
            if old is None and rec is None:
                self._observe(cidr, None)
                continue
            if old is not None and rec is not None and old.lean == rec:
                self._observe(cidr, old)
                continue
            try:
                held = diff.block(cidr, old, rec, now)
            except BadAttribute as exc:
                # As the generic path treats a block it cannot read: not mirrored, so none of its IPs can
                # be released on the strength of it (its allocations vanish from the mirror).
                log.warning("malformed ipamblocks %s: %s; not mirrored, its IPs are kept", cidr, exc)
                m.on_malformed_block()
                held = diff.block(cidr, old, None, now) if old is not None else None
            self._observe(cidr, held)
            if held is None:
                if old is not None:
                    del mem.blocks[cidr]
                    writes.base_del(m.keys.blocks, cidr)
            else:
                mem.blocks[cidr] = held
                lean = held.lean
                record = encode_block_packed(
                    lean.resource_version, lean.uid, lean.host, lean.in_use, held.packed, lean.cooling_since
                )
                writes.base_set(m.keys.blocks, cidr, record)
        for node, shard in vanished_on.items():
            # A node that is gone may now be drained: re-validate what is left on it (its tunnel IPs).
            if node not in mem.nodes:
                writes.dirty_node_sets.append((shard, node))
        return m._send(writes)

    def _observe(self, cidr: str, held: HeldBlock | None) -> None:
        observer = self.mirror.block_observer
        if observer is not None:
            if held is None:
                observer(cidr, None, None)
            else:
                observer(cidr, held.host, held.nodes)


def chunks(
    latest: Mapping[str, IPAMBlock | MirroredBlock | None], size: int
) -> Iterator[list[tuple[str, IPAMBlock | MirroredBlock | None]]]:
    """`latest` in order, in chunks of at most `size` blocks and `size` × `ALLOCATIONS_PER_OBJECT`
    allocations (a block's in-use count; a gone block weighs one); a block heavier than that alone."""
    budget = size * ALLOCATIONS_PER_OBJECT
    chunk: list[tuple[str, IPAMBlock | MirroredBlock | None]] = []
    weight = 0
    for item in latest.items():
        block = item[1]
        held = max(1, _in_use(block))
        if chunk and (len(chunk) >= size or weight + held > budget):
            yield chunk
            chunk, weight = [], 0
        chunk.append(item)
        weight += held
    if chunk:
        yield chunk


def _in_use(block: IPAMBlock | MirroredBlock | None) -> int:
    if block is None:
        return 0
    if isinstance(block, MirroredBlock):
        return block.record.in_use
    return sum(a is not None for a in block.allocations)


def _lean_of(block: IPAMBlock | MirroredBlock) -> LeanBlock:
    return block.record if isinstance(block, MirroredBlock) else lean_of(block)
