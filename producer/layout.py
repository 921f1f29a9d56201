"""Bringing a Redis written by an older ipamgc to the key layout this watcher writes (`shared.keys.LAYOUT`).

Why a module of its own: the watcher diffs every event against the blocks Redis holds and writes only what
changed, so an index whose layout changed would stay empty for every allocation that does not change, and
the leader would hold their releases for ever ("not in the handle index yet").  Layout 2 moved the handle
index from one HASH per handle (`P:handle:<handle>`, one HSET per allocation) to one ZSET (`P:handles`), and
the pulse from a counter (`P:pulse`) to a stream (`P:pulses`).  `migrate` runs once when a watcher starts: it
fills `P:handles` from the stored block records, then deletes the per-handle hashes those records name, then
records the layout.  A migration cut off half-way runs again at the next start (every step is idempotent);
meanwhile the leader finds a handle incomplete and holds, which is the safe side.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import redis

from producer.memory import Memory, Placement
from producer.redis_scripts import ProducerScripts
from producer.writes import Writes
from shared import keys as k
from shared.blockrecords import decode_slot
from shared.gcrecords import encode_handle_member
from shared.keys import Keys, handle_field
from shared.model import allocation_id
from shared.netaddr import ordinal_ip_text, parse_network

log = logging.getLogger(__name__)

DELETE_CHUNK = 1000


def migrate(client: redis.Redis, keys: Keys, memory: Callable[[], Memory], scripts: ProducerScripts) -> int:
    """Bring Redis to `LAYOUT` (see the module docstring); returns the allocations re-indexed.
    `memory` returns the watcher's memory loaded from this Redis (the stored blocks): called only when
    the layout is older."""
    stored = client.hget(keys.state, k.STATE_LAYOUT)
    if stored == k.LAYOUT.encode():
        return 0
    writes = Writes(keys, scripts)
    old: set[str] = set()
    indexed = 0
    mem = memory()
    for cidr, held in mem.blocks.items():
        net = parse_network(cidr)
        for ordinal, packed in held.packed.items():
            slot = decode_slot(packed)
            p = Placement.of(slot, mem.shards)
            alloc_id = allocation_id(slot.handle, ordinal_ip_text(net, ordinal))
            writes.zadd(keys.handles, encode_handle_member(p.handle, handle_field(alloc_id), p.node))
            old.add(keys.old_handle(p.handle))
            indexed += 1
    writes.execute(client, 0, arm=False)
    order = sorted(old)
    for i in range(0, len(order), DELETE_CHUNK):
        client.delete(*order[i : i + DELETE_CHUNK])
    client.delete(keys.old_pulse)  # the counter `P:pulses` replaced
    client.hset(keys.state, k.STATE_LAYOUT, k.LAYOUT)
    if stored is not None or indexed:
        log.info(
            "key layout %s: %d allocations moved into the handle index, %d per-handle hashes deleted",
            k.LAYOUT,
            indexed,
            len(order),
        )
    return indexed
