"""The watcher's Lua scripts of the mirror: server-side steps that would otherwise ship whole sets to Python
and back.  The shard queue's scripts (the kick that arms a shard among them) are the protocol's,
`redisio.shardqueue.lua`.

Each touches the keys of one shard only (one `{s}` hash tag), so they run unchanged on Redis Cluster.
Time, when a script needs it, comes in ARGV; a script never reads the server clock.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis
from redis.commands.core import Script

# Copy a set into another (a node's allocation ids into its shard's dirty set, or its block CIDRs into
# the shard's dirtyblocks set) without the members leaving Redis.
DIRTY_FROM_SET = """
-- KEYS[1] destination set (dirty:{s} or dirtyblocks:{s})
-- KEYS[2] source set (nodeallocs:{s}:<node> or nodeblocks:{s}:<node>), same shard
-- ARGV    none
-- returns the number of members newly added to KEYS[1]
local members = redis.call('SMEMBERS', KEYS[2])
local added = 0
for i = 1, #members, 1000 do
  added = added + redis.call('SADD', KEYS[1], unpack(members, i, math.min(i + 999, #members)))
end
return added
"""

# One step of a full resync: mark a chunk of a shard's allocation ids dirty.
MARK_DIRTY_CHUNK = """
-- KEYS[1] alloc:{s} (hash of allocation records)
-- KEYS[2] dirty:{s}
-- ARGV[1] HSCAN cursor ("0" to start)
-- ARGV[2] HSCAN COUNT hint (chunk size)
-- returns {next cursor ("0" when done), ids newly added to dirty}
local page = redis.call('HSCAN', KEYS[1], ARGV[1], 'COUNT', ARGV[2])
local flat = page[2]
local ids = {}
for i = 1, #flat, 2 do ids[#ids + 1] = flat[i] end
local added = 0
for i = 1, #ids, 1000 do
  added = added + redis.call('SADD', KEYS[2], unpack(ids, i, math.min(i + 999, #ids)))
end
return {page[1], added}
"""


@dataclass(frozen=True, slots=True)
class ProducerScripts:
    dirty_from_set: Script
    mark_dirty_chunk: Script

    @classmethod
    def register(cls, client: redis.Redis) -> ProducerScripts:
        return cls(
            dirty_from_set=client.register_script(DIRTY_FROM_SET),
            mark_dirty_chunk=client.register_script(MARK_DIRTY_CHUNK),
        )
