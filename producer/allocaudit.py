"""After Redis lost writes: the blocks whose allocation records Redis no longer has all of.

Why a module: the backstop's audit (`producer/backstop.py`) compares the records the rules read back as
bases (`P:blocks`, `P:pods`, `P:nodes`) with what the watcher remembers writing.  A loss can leave a
block's base right and its allocation records wrong: an allocation added during the lost seconds (its
`alloc:{s}` record written, then lost), then another change of the same block written after the
failover but before the watcher noticed the loss, which writes the block's base whole again but only the
allocation that changed.  The base then matches the watcher's memory, and the lost allocation is in no
record any worker reads: its leak would never be found.  So on a loss (`producer/generation.py`) every
allocation the watcher holds is looked up in its shard's hash (HMGET, `AUDIT_COUNT` a call: 30 calls at
150,000 allocations, on a loss only), and a block missing any is forgotten, so that the blocks' relist
writes it whole (every record, index entry and dirty mark, as for a new block).

The same look is taken when a watcher starts on a Redis that is not marked synced and holds blocks
(`Watcher._forget_partial_blocks`): a FLUSHALL or a restart landing inside a watcher's pipeline (not a
transaction) leaves the commands after it, and the block bases are written after the allocation records,
so a base can be left without them; the watcher that wrote it exits on the loss, and the next one, which
loads its memory from that Redis, would otherwise take the base for a block whose records are there.
"""

from __future__ import annotations

from collections import defaultdict

import redis

from producer.memory import Memory, Placement
from shared.blockrecords import decode_slot
from shared.codec import RecordError
from shared.keys import Keys

CHUNK = 5000  # fields per HMGET


def blocks_missing_records(client: redis.Redis, keys: Keys, memory: Memory, shards: int) -> set[str]:
    """The CIDRs of held blocks with an allocation whose `alloc:{s}` record Redis lacks."""
    wanted: dict[int, list[tuple[str, str]]] = defaultdict(list)  # shard → (allocation id, block CIDR)
    for cidr, held in memory.blocks.items():
        for ordinal, packed in held.packed.items():
            try:
                shard = Placement.of(decode_slot(packed), shards).shard
            except RecordError:
                continue
            if shard is None:  # no node attribute: no allocation record is written for it
                continue
            alloc_id = memory.alloc_id_at(cidr, ordinal, "the allocation audit")
            if alloc_id is not None:
                wanted[shard].append((alloc_id, cidr))
    missing: set[str] = set()
    for shard, items in sorted(wanted.items()):
        for i in range(0, len(items), CHUNK):
            part = items[i : i + CHUNK]
            found = client.hmget(keys.alloc(shard), [alloc_id for alloc_id, _ in part])
            missing.update(cidr for (_, cidr), value in zip(part, found, strict=True) if value is None)
    return missing


def forget_blocks_missing_records(client: redis.Redis, keys: Keys, memory: Memory, shards: int) -> set[str]:
    """Forget the held blocks with an allocation record Redis lacks (`blocks_missing_records`), so that
    their next list writes them whole; returns their CIDRs."""
    missing = blocks_missing_records(client, keys, memory, shards)
    for cidr in missing:
        memory.forget_block(cidr)
    return missing
