"""The Lua scripts of lingering shard jobs: hold a shard's `queued` flag, look at a held shard, let it go.

Its own module because these are the atomic half of the flag protocol (`workers.shards.linger`'s docstring),
next to the queue's own scripts (`workers.shards.queue`; `STEP` runs on top of its `LEASE_LUA`): each one
reads and writes a shard's keys in one step, so that two jobs, the watcher and `kick` never both believe they
own a shard.  Kept apart from the job's loop, which only decides when to run them.
"""

# Values of `queued:{s}`: `1` is a pending job (the watcher's SET NX); anything else a holder's token.
PENDING = "1"

HOLD = """
-- Hold a shard's queued flag for this job.
-- KEYS[1] queued:{s}
-- ARGV[1] token    ARGV[2] hold (milliseconds, at most one work lease)
-- ARGV[3] "own": the job enqueued for this shard starts; "adopt": a lingering job takes over a shard;
-- "concentrate": as "adopt", and a shard another lingering job holds is taken from it when that job's
-- token sorts after this one's (a lightly loaded job gathers the shards of later ones: one job wakes per
-- pulse instead of one per worker; the other job sees the shard held at its next renewal and lets go)
-- returns 1 when this job holds the flag now, 0 when another live job does (the flag is left alone),
-- 2 ("own" only) when the flag is absent: the job it was armed for is done (a lingering job adopted
-- the shard and released it; it re-arms when ids remain), so this job has nothing to do
local v = redis.call('GET', KEYS[1])
if not v and ARGV[3] == 'own' then return 2 end
if v and v ~= ARGV[1] then
  if v ~= '1' and not (ARGV[3] == 'concentrate' and v > ARGV[1]) then return 0 end
  -- `1` with a PTTL within one lease: a running job without a token holds it; only its own job runs.
  if v == '1' and ARGV[3] ~= 'own' and redis.call('PTTL', KEYS[1]) <= tonumber(ARGV[2]) then return 0 end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""

STEP = """
-- One look at a held shard: renew the flag, reap expired leases, promote due candidates, take a batch.
-- KEYS[1] queued:{s}    KEYS[2] dirty:{s}    KEYS[3] inflight:{s}    KEYS[4] due:{s}
-- ARGV[1] token    ARGV[2] hold (ms)    ARGV[3] now (epoch s)    ARGV[4] lease (s)    ARGV[5] N
-- ARGV[6] "1" to renew the flag    ARGV[7] "1" to reap    ARGV[8] "1" to promote
-- returns {held, deadline, {ids}, reaped, promoted, earliest due or ''} ({0} when another job holds it)
if ARGV[6] == '1' then
  local v = redis.call('GET', KEYS[1])
  if v and v ~= ARGV[1] and v ~= '1' then return {0} end
  -- ours, expired, or re-armed by `kick` for a job still waiting (it will find the shard held)
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
local now = ARGV[3]
local reaped, promoted, nextdue = 0, 0, ''
if ARGV[7] == '1' then reaped = back_to_dirty(KEYS[3], KEYS[2], now, ARGV[5]) end
if ARGV[8] == '1' then
  promoted = back_to_dirty(KEYS[4], KEYS[2], now, ARGV[5])
  local first = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
  if #first > 0 then nextdue = first[2] end
end
local ids = redis.call('SPOP', KEYS[2], ARGV[5])
local deadline = string.format('%.17g', tonumber(now) + tonumber(ARGV[4]))
lease(KEYS[3], ids, deadline)
return {1, deadline, ids, reaped, promoted, nextdue}
"""

RELEASE = """
-- A lingering job lets a shard go: clear the flag if it is still ours; re-arm it when ids remain dirty
-- and re-arming is allowed (the caller must then enqueue a job).  Another holder's flag is left alone.
-- KEYS[1] queued:{s}    KEYS[2] dirty:{s}
-- ARGV[1] token    ARGV[2] queued flag TTL (ms)    ARGV[3] "1" to re-arm when work remains
-- returns 1 when the caller must enqueue, else 0
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
if ARGV[3] == '1' and redis.call('SCARD', KEYS[2]) > 0 then
  redis.call('SET', KEYS[1], '1', 'PX', ARGV[2])
  return 1
end
return 0
"""
