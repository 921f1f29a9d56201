"""The watcher's Lua scripts: server-side steps that would otherwise ship whole sets to Python and back.

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

# Arm a shard's job when it has work and none is pending: dirty ids, a candidate whose grace period has
# ended, or a lease that expired (its worker died).  The watcher runs it when the earliest due time it
# knows of passes (and at least every `kick_interval_seconds`): it is what re-checks a candidate when no
# event arrives.  It also says when to run it next for this shard: the earliest due time still ahead, or
# the time a lease held now would count as dead.
KICK = """
-- KEYS[1] queued:{s}
-- KEYS[2] dirty:{s}
-- KEYS[3] due:{s}
-- KEYS[4] inflight:{s}
-- ARGV[1] now (epoch seconds)
-- ARGV[2] queued flag TTL (milliseconds)
-- ARGV[3] slack (seconds): a lease expired longer ago than this means its job died
-- ARGV[4] unstarted (milliseconds): a flag set longer ago than this that no running job has touched
-- ARGV[5] a running job's hold on the flag (milliseconds): it keeps the flag at most this far ahead
-- returns {1 when the flag was set (the caller must enqueue a job) else 0,
--          the next time to kick this shard (epoch seconds, a string) or false when nothing is ahead}
local function next_kick()
  local now = tonumber(ARGV[1])
  local due = redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. ARGV[1], '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  local at = due[2] and tonumber(due[2])
  local lease = redis.call('ZRANGEBYSCORE', KEYS[4], '(' .. (now - tonumber(ARGV[3])), '+inf',
    'WITHSCORES', 'LIMIT', 0, 1)
  if lease[2] then
    local dead = tonumber(lease[2]) + tonumber(ARGV[3])
    if not at or dead < at then at = dead end
  end
  if at then return string.format('%.6f', at) end
  return false
end
local function armed(flag)
  return {flag, next_kick()}
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  -- A job is pending or running.  If one of its leases expired long ago, the worker holding it was
  -- killed: re-arm now rather than when the flag expires.  A duplicate job is harmless (leases dedupe).
  local stale = tonumber(ARGV[1]) - tonumber(ARGV[3])
  if #redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', stale, 'LIMIT', 0, 1) == 0 then
    -- Likewise a flag armed long ago that no job has run under since (a running job keeps it within
    -- ARGV[5]): the process that set it died before enqueueing, or the job waits behind a backlog.
    local pttl = redis.call('PTTL', KEYS[1])
    local age = tonumber(ARGV[2]) - pttl
    if pttl <= tonumber(ARGV[5]) or age <= tonumber(ARGV[4]) or redis.call('SCARD', KEYS[2]) == 0 then
      return armed(0)
    end
  end
  redis.call('SET', KEYS[1], '1', 'PX', ARGV[2])
  return armed(1)
end
local work = redis.call('SCARD', KEYS[2]) > 0
if not work then
  work = #redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', ARGV[1], 'LIMIT', 0, 1) > 0
end
if not work then
  work = #redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', ARGV[1], 'LIMIT', 0, 1) > 0
end
if work then
  redis.call('SET', KEYS[1], '1', 'PX', ARGV[2])
  return armed(1)
end
return armed(0)
"""


@dataclass(frozen=True, slots=True)
class ProducerScripts:
    dirty_from_set: Script
    mark_dirty_chunk: Script
    kick: Script

    @classmethod
    def register(cls, client: redis.Redis) -> ProducerScripts:
        return cls(
            dirty_from_set=client.register_script(DIRTY_FROM_SET),
            mark_dirty_chunk=client.register_script(MARK_DIRTY_CHUNK),
            kick=client.register_script(KICK),
        )
