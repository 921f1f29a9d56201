"""A shard's work queue in Redis: dirty SET → leased in-flight ZSET → ack, with a reaper and due timers.

This is client-go's workqueue (a `dirty` set plus a `processing` set) made durable and shared between
processes: an id dirtied again while in flight stays in `dirty` and is validated once more after the ack,
so no update is lost; an id whose worker died comes back when its lease expires.  RQ only carries
"shard s has work" (one job per shard at a time, the `queued` flag); the ids never pass through RQ.
Every multi-key step is one Lua script over keys of one `{s}` hash tag; time is always an ARGV, never
read inside Lua (all processes must agree on one clock, the callers' `Clock`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import redis
from redis.commands.core import Script

from shared import luapipe
from shared.keys import QUEUED_TTL_SECONDS, Keys

log = logging.getLogger("workers.queue")  # its pre-split name (#37): log lines unchanged

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
-- KEYS[1] queued:{s}    KEYS[2] dirty:{s}
-- ARGV[1] queued flag TTL (milliseconds)    ARGV[2] "1" to re-arm when work remains, "0" not to
-- returns 1 when the caller must enqueue, else 0
redis.call('DEL', KEYS[1])
if ARGV[2] == '1' and redis.call('SCARD', KEYS[2]) > 0 then
  redis.call('SET', KEYS[1], '1', 'PX', ARGV[1])
  return 1
end
return 0
"""


@dataclass(frozen=True, slots=True)
class Lease:
    token: str  # the deadline, as stored in the in-flight ZSET
    ids: tuple[str, ...]
    dropped: int = 0  # taken members that were not text (corrupt or forged): removed, never validated

    @property
    def deadline(self) -> float:
        return float(self.token)


class ShardQueue:
    """The queue operations of one shard (see the module docstring)."""

    def __init__(
        self, client: redis.Redis, keys: Keys, shard: int, queued_ttl: float = QUEUED_TTL_SECONDS
    ) -> None:
        self.redis = client
        self.keys = keys.shard(shard)
        self.shard = shard
        self.queued_ttl_ms = int(queued_ttl * 1000)
        self._take: Script = client.register_script(LEASE_LUA + TAKE)
        self._ack: Script = client.register_script(ACK)
        self._nack: Script = client.register_script(NACK)
        self._reap: Script = client.register_script(LEASE_LUA + REAP)
        self._promote: Script = client.register_script(LEASE_LUA + PROMOTE)
        self._finish: Script = client.register_script(FINISH)

    def take(self, now: float, lease: float, limit: int) -> Lease:
        """Lease up to `limit` dirty ids until `now + lease` (seconds)."""
        deadline, ids = self._take(
            keys=[self.keys.dirty, self.keys.inflight], args=[repr(now), repr(lease), limit]
        )
        good: list[str] = []
        bad: list[bytes] = []
        for raw in ids:
            try:
                good.append(_text(raw))
            except UnicodeDecodeError:
                bad.append(raw)  # an allocation id is text: this one would fail every job that took it
        if bad:
            log.warning("dropped %d dirty members that are not text: %r", len(bad), bad[:3])
            self.redis.zrem(self.keys.inflight, *bad)
        return Lease(_text(deadline), tuple(good), len(bad))

    def ack(self, lease: Lease, ids: Sequence[str] | None = None) -> int:
        """Finish `ids` (default: the whole lease)."""
        todo = lease.ids if ids is None else ids
        if not todo:
            return 0
        return int(self._ack(keys=[self.keys.inflight], args=[lease.token, *todo]))

    def ack_in(self, pipe: redis.client.Pipeline, lease: Lease) -> None:
        """Queue the ack of the whole lease into `pipe` (it runs with the batch's writes)."""
        if lease.ids:
            luapipe.add(pipe, self._ack, [self.keys.inflight], [lease.token, *lease.ids])

    @property
    def pipelined_scripts(self) -> tuple[Script, ...]:
        """The scripts `ack_in` queues (for `shared.luapipe.execute`)."""
        return (self._ack,)

    def nack(self, lease: Lease, ids: Sequence[str] | None = None) -> int:
        """Return `ids` (default: the whole lease) to dirty unvalidated."""
        todo = lease.ids if ids is None else ids
        if not todo:
            return 0
        return int(self._nack(keys=[self.keys.inflight, self.keys.dirty], args=[lease.token, *todo]))

    def reap(self, now: float, limit: int = 1000) -> int:
        """Return leases that expired at or before `now` to dirty."""
        return int(self._reap(keys=[self.keys.inflight, self.keys.dirty], args=[repr(now), limit]))

    def promote(self, now: float, limit: int = 1000) -> int:
        """Make candidates whose grace period ended at or before `now` dirty."""
        return int(self._promote(keys=[self.keys.due, self.keys.dirty], args=[repr(now), limit]))

    def finish(self, rearm: bool) -> bool:
        """Clear the queued flag; True when work remains and the caller must enqueue a new job."""
        args = [self.queued_ttl_ms, "1" if rearm else "0"]
        return bool(self._finish(keys=[self.keys.queued, self.keys.dirty], args=args))


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, str):
        return value
    raise TypeError(f"unexpected Redis reply {value!r}")
