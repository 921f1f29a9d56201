"""Every Lua script of the shard queue, with its `KEYS`/`ARGV` header: the protocol's atomic steps.

Why one module: the `queued:{s}` flag, the `dirty:{s}` set, the `inflight:{s}` leases and the `due:{s}`
timers are read and written by the watcher (`KICK` arms a shard), by a shard job (`TAKE`, `ACK`, `NACK`,
`REAP`, `PROMOTE`, `FINISH`; a lingering job's `HOLD`, `STEP`, `RELEASE`), and each step must agree with
the others on what a value of the flag means (`PENDING`, a holder's token, a PTTL of at most one work
lease: a running job).  Here they are read side by side.  Each script touches the keys of one shard only
(one `{s}` hash tag), so they run unchanged on Redis Cluster; time always comes in ARGV, never from the
server clock (all processes must agree on one clock, the callers' `Clock`).  The Python that runs them is
`redisio.shardqueue.queue`.
"""

# -- leasing, ack, re-arm: a shard job's queue (`ShardQueue`) ------------------------------------

# Lua functions shared by the scripts that take work (prepended to them): lease popped ids into the
# in-flight ZSET; move ids whose score is due back into dirty.
LEASE_LUA = """
local function lease(inflight, ids, deadline)
  for i = 1, #ids, 1000 do
    local args = {}
    for j = i, math.min(i + 999, #ids) do
      args[#args + 1] = deadline
      args[#args + 1] = ids[j]
    end
    redis.call('ZADD', inflight, unpack(args))
  end
end
local function back_to_dirty(zset, dirty, now, limit)
  local ids = redis.call('ZRANGEBYSCORE', zset, '-inf', now, 'LIMIT', 0, limit)
  if #ids > 0 then
    redis.call('SADD', dirty, unpack(ids))
    redis.call('ZREM', zset, unpack(ids))
  end
  return #ids
end
"""

TAKE = """
-- Take up to N dirty ids and lease them.
-- KEYS[1] dirty:{s}    KEYS[2] inflight:{s}
-- ARGV[1] now (epoch seconds)    ARGV[2] lease (seconds)    ARGV[3] N (max ids)
-- returns {deadline, {ids}}; deadline = now + lease, as a string, is also the lease token for ack
local ids = redis.call('SPOP', KEYS[1], ARGV[3])
local deadline = string.format('%.17g', tonumber(ARGV[1]) + tonumber(ARGV[2]))
lease(KEYS[2], ids, deadline)
return {deadline, ids}
"""

ACK = """
-- Finish leased ids: drop them from in-flight, but only where the lease is still ours (its score is our
-- deadline); a lease that expired and was taken again by another job is left alone.  One ZMSCORE and one
-- ZREM per call, not two commands per id (Redis >= 6.2).
-- KEYS[1] inflight:{s}
-- ARGV[1] lease token (the deadline TAKE returned)    ARGV[2..] ids
-- returns the number of ids acked
local token = tonumber(ARGV[1])
local acked = 0
for i = 2, #ARGV, 1000 do
  local last = math.min(i + 999, #ARGV)
  local scores = redis.call('ZMSCORE', KEYS[1], unpack(ARGV, i, last))
  local ours = {}
  for j = 1, #scores do
    if scores[j] and tonumber(scores[j]) == token then ours[#ours + 1] = ARGV[i + j - 1] end
  end
  if #ours > 0 then acked = acked + redis.call('ZREM', KEYS[1], unpack(ours)) end
end
return acked
"""

NACK = """
-- Give leased ids back without validating them (e.g. the datastore is not ready): back to dirty.
-- KEYS[1] inflight:{s}    KEYS[2] dirty:{s}
-- ARGV[1] lease token    ARGV[2..] ids
-- returns the number of ids returned
local token = tonumber(ARGV[1])
local back = 0
for i = 2, #ARGV do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) == token then
    redis.call('ZREM', KEYS[1], ARGV[i])
    back = back + redis.call('SADD', KEYS[2], ARGV[i])
  end
end
return back
"""

REFILL = """
-- Move the next ids of a shard's revalidation pass into dirty and move the pass on, only over the value the
-- caller read (a job that read an older pass, or one another job moved on since, changes nothing).
-- KEYS[1] revalidate:{s}    KEYS[2] dirty:{s}
-- ARGV[1] the value read (`<pass>:<cursor>`)    ARGV[2] the next value, or '' when the pass is done
-- ARGV[3..] ids (the fields the caller's HSCAN of alloc:{s} returned from that cursor)
-- returns 1 when moved, 0 when the value had changed
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
for i = 3, #ARGV, 1000 do
  redis.call('SADD', KEYS[2], unpack(ARGV, i, math.min(i + 999, #ARGV)))
end
if ARGV[2] == '' then redis.call('DEL', KEYS[1]) else redis.call('SET', KEYS[1], ARGV[2]) end
return 1
"""

REAP = """
-- Return expired leases (their worker died or overran) to dirty.
-- KEYS[1] inflight:{s}    KEYS[2] dirty:{s}
-- ARGV[1] now (epoch seconds)    ARGV[2] max ids per call
-- returns the number of ids returned
return back_to_dirty(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
"""

PROMOTE = """
-- Candidates whose grace period has ended become dirty again, so they are confirmed with no new event.
-- KEYS[1] due:{s}    KEYS[2] dirty:{s}
-- ARGV[1] now (epoch seconds)    ARGV[2] max ids per call
-- returns the number of ids promoted
return back_to_dirty(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
"""

FINISH = """
-- End of a shard job: clear the queued flag; if dirty ids remain (dirtied while we ran, or the time
-- budget ran out) and re-arming is allowed, set it again: the caller must then enqueue a new job.
-- KEYS[1] queued:{s}    KEYS[2] dirty:{s}    KEYS[3] revalidate:{s}
-- ARGV[1] queued flag TTL (milliseconds)    ARGV[2] "1" to re-arm when work remains, "0" not to
-- returns 1 when the caller must enqueue, else 0
redis.call('DEL', KEYS[1])
if ARGV[2] == '1' and (redis.call('SCARD', KEYS[2]) > 0 or redis.call('EXISTS', KEYS[3]) == 1) then
  redis.call('SET', KEYS[1], '1', 'PX', ARGV[1])
  return 1
end
return 0
"""

# -- the flag: a lingering job holds, looks at, lets go of a shard (`ShardFlags`) -------------------------

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
-- KEYS[5] revalidate:{s}
-- ARGV[1] token    ARGV[2] hold (ms)    ARGV[3] now (epoch s)    ARGV[4] lease (s)    ARGV[5] N
-- ARGV[6] "1" to renew the flag    ARGV[7] "1" to reap    ARGV[8] "1" to promote
-- returns {held, deadline, {ids}, reaped, promoted, earliest due or '', the pending revalidation pass
-- (`<pass>:<cursor>`) or ''} ({0} when another job holds it)
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
return {1, deadline, ids, reaped, promoted, nextdue, redis.call('GET', KEYS[5]) or ''}
"""

RELEASE = """
-- A lingering job lets a shard go: clear the flag if it is still ours; re-arm it when ids remain dirty
-- and re-arming is allowed (the caller must then enqueue a job).  Another holder's flag is left alone.
-- KEYS[1] queued:{s}    KEYS[2] dirty:{s}    KEYS[3] revalidate:{s}
-- ARGV[1] token    ARGV[2] queued flag TTL (ms)    ARGV[3] "1" to re-arm when work remains
-- returns 1 when the caller must enqueue, else 0
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
if ARGV[3] == '1' and (redis.call('SCARD', KEYS[2]) > 0 or redis.call('EXISTS', KEYS[3]) == 1) then
  redis.call('SET', KEYS[1], '1', 'PX', ARGV[2])
  return 1
end
return 0
"""

# -- arming: the watcher's kick (`ShardFlags.kick_in`) ---------------------------------------------------

# `kick` re-arms a shard whose pending job holds a lease that expired this long ago: its worker was
# killed, and waiting for the `queued` flag to expire (minutes) would stall the shard.  Longer than the
# reaper's own grace, so a live job that is merely slow is rarely duplicated (and a duplicate is harmless).
KICK_STALE_LEASE_SECONDS = 5.0
# `kick` also re-arms a shard whose `queued` flag was set this long ago and that no running job has held
# since (a running job keeps the flag within one work lease): the process that set it died before it
# enqueued the job, or the job waits behind a backlog, where a duplicate costs one job that finds little.
KICK_UNSTARTED_SECONDS = 10.0

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
-- KEYS[5] revalidate:{s}
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
    local idle = redis.call('SCARD', KEYS[2]) == 0 and redis.call('EXISTS', KEYS[5]) == 0
    if pttl <= tonumber(ARGV[5]) or age <= tonumber(ARGV[4]) or idle then
      return armed(0)
    end
  end
  redis.call('SET', KEYS[1], '1', 'PX', ARGV[2])
  return armed(1)
end
local work = redis.call('SCARD', KEYS[2]) > 0 or redis.call('EXISTS', KEYS[5]) == 1
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
