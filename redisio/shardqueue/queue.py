"""A shard's work queue in Redis: dirty SET → leased in-flight ZSET → ack, with a reaper and due timers;
and the `queued:{s}` flag that says a job serves the shard: armed, held, looked at, let go, re-armed.

This is client-go's workqueue (a `dirty` set plus a `processing` set) made durable and shared between
processes: an id dirtied again while in flight stays in `dirty` and is validated once more after the ack,
so no update is lost; an id whose worker died comes back when its lease expires.  RQ only carries
"shard s has work" (one job per shard at a time, the `queued` flag; the job itself is
`redisio.shardqueue.jobs`); the ids never pass through RQ.  Every multi-key step is one Lua script over
keys of one `{s}` hash tag (`redisio.shardqueue.lua`); time is always an ARGV, never read inside Lua (all
processes must agree on one clock, the callers' `Clock`).

`ShardQueue` is a shard job's side of one shard (take, ack, nack, reap, promote, finish); `ShardFlags` is
the flag of every shard, for the watcher (`kick_in`, `disarm`; a batch's `arm_in`) and for lingering
jobs (`hold`, `step_in`, `release`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import redis
from redis.commands.core import Script

from redisio import luapipe
from redisio.shardqueue.lua import (
    ACK,
    FINISH,
    HOLD,
    KICK,
    KICK_STALE_LEASE_SECONDS,
    KICK_UNSTARTED_SECONDS,
    LEASE_LUA,
    NACK,
    PENDING,
    PROMOTE,
    REAP,
    REFILL,
    RELEASE,
    STEP,
    TAKE,
)
from shared.keys import QUEUED_TTL_SECONDS, Keys

log = logging.getLogger("workers.queue")  # its pre-split name (#37): log lines unchanged

# HSCAN rounds a refill makes at most before it hands what it found to dirty (a round can find few ids:
# COUNT is a number of the hash's buckets to visit, not of fields).
REFILL_ROUNDS = 8


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
        self._refill: Script = client.register_script(REFILL)

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
        """The scripts `ack_in` queues (for `redisio.luapipe.execute`)."""
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

    def keep_flag(self, lease: float) -> None:
        """A draining job is alive: its `queued` flag now expires one `lease` (seconds) from here, so a
        worker killed between batches (holding no lease for the reaper) frees its shard within a lease,
        not after the flag's TTL; `kick` then re-arms it."""
        self.redis.pexpire(self.keys.queued, max(1, int(lease * 1000)))

    def finish(self, rearm: bool) -> bool:
        """Clear the queued flag; True when work remains and the caller must enqueue a new job."""
        args = [self.queued_ttl_ms, "1" if rearm else "0"]
        return bool(self._finish(keys=[self.keys.queued, self.keys.dirty, self.keys.revalidate], args=args))

    def refill(self, limit: int, value: bytes | None = None) -> bool:
        """Move about `limit` more ids of the shard's revalidation pass (`P:revalidate:{s}`, `shared/keys.py`)
        into dirty: HSCAN of `alloc:{s}` from the pass's cursor, then `REFILL`, which moves the pass on only
        over the value read.  `value`: the pass as the caller read it (None: read it here).  True when there
        may be more to take (ids moved, the pass goes on, or another job moved it meanwhile); False when no
        pass is pending.  An unreadable value starts the pass again (a wrong shape re-validates more, never
        less)."""
        if value is None:
            raw = self.redis.get(self.keys.revalidate)
            if not isinstance(raw, bytes):
                return False
            value = raw
        name, sep, at = value.rpartition(b":")
        if not sep or not at.isdigit():
            log.warning(
                "unreadable revalidation pass %r: starting it again", value[:60], extra={"shard": self.shard}
            )
            self._refill(keys=[self.keys.revalidate, self.keys.dirty], args=[value, b"again:0"])
            return True
        cursor = int(at)
        ids: list[bytes] = []
        for _ in range(REFILL_ROUNDS):
            cursor, fields = self.redis.hscan(self.keys.alloc, cursor, count=max(1, limit - len(ids)))
            ids += [f for f in fields if isinstance(f, bytes)]  # a client of bytes replies
            if cursor == 0 or len(ids) >= limit:
                break
        after = b"" if cursor == 0 else name + b":" + str(cursor).encode()
        moved = int(self._refill(keys=[self.keys.revalidate, self.keys.dirty], args=[value, after, *ids]))
        return not moved or bool(ids) or bool(after)


def arm_in(pipe: redis.client.Pipeline, keys: Keys, shard: int, queued_ttl_ms: int) -> None:
    """Queue `SET queued:{s} 1 NX PX ttl` (the watcher's batch arms a shard it dirtied): its reply, true,
    says the shard was armed and the caller must enqueue its job."""
    pipe.set(keys.queued(shard), PENDING.encode(), nx=True, px=queued_ttl_ms)


class ShardFlags:
    """The `queued:{s}` flag of every shard, as the scripts of `redisio.shardqueue.lua` read and write it.

    `1` (`PENDING`) is a job armed and waiting in its RQ queue (set by the watcher's batch, `kick`,
    `finish` and a re-arming `release`); any other value is the token of the lingering job that holds the
    shard, with a PTTL of at most one work lease, renewed well within it.  Each `*_in` method queues one
    bare EVALSHA (or command) into the caller's pipeline, to run with `redisio.luapipe.execute(pipe, client,
    <the scripts it names>, held)`; its reply is the script's (see its header)."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.redis = client
        self.keys = keys
        self.hold_script: Script = client.register_script(HOLD)
        self.step_script: Script = client.register_script(LEASE_LUA + STEP)
        self.release_script: Script = client.register_script(RELEASE)
        self.kick_script: Script = client.register_script(KICK)

    # -- the watcher: arming (and `arm_in`, for a batch's pipeline) ---------------------------------

    def kick_in(
        self, pipe: redis.client.Pipeline, shard: int, now: str, queued_ttl_ms: int, hold_ms: int
    ) -> None:
        """Queue `KICK` for `shard` at `now` (epoch seconds, as text): re-arm it when it has work and no
        live job (`hold_ms`: a running job's hold on the flag, one work lease)."""
        keys = [
            self.keys.queued(shard),
            self.keys.dirty(shard),
            self.keys.due(shard),
            self.keys.inflight(shard),
            self.keys.revalidate(shard),
        ]
        unstarted_ms = int(KICK_UNSTARTED_SECONDS * 1000)
        args: list[str | int | float] = [now, queued_ttl_ms, KICK_STALE_LEASE_SECONDS, unstarted_ms, hold_ms]
        luapipe.add(pipe, self.kick_script, keys, args)

    def disarm(self, shards: Sequence[int]) -> None:
        """Drop the flags of `shards` (armed, but their jobs could not be enqueued), so that the next event
        or kick arms them again instead of the shards stalling until the flags expire."""
        if shards:
            self.redis.delete(*(self.keys.queued(s) for s in shards))

    # -- a lingering job: read, hold, look, let go ------------------------------------------------

    def read_in(self, pipe: redis.client.Pipeline, shard: int) -> None:
        """Queue the flag's value and PTTL (ms) for `shard`: two replies, None and -2 when it is absent."""
        pipe.get(self.keys.queued(shard))
        pipe.pttl(self.keys.queued(shard))

    def hold(self, shard: int, token: str, hold_ms: int, mode: str) -> int:
        """`HOLD` the flag of `shard` for `token` now (`mode`: own, adopt, concentrate); its reply."""
        return int(self.hold_script(keys=[self.keys.queued(shard)], args=[token, hold_ms, mode]))

    def hold_in(self, pipe: redis.client.Pipeline, shard: int, token: str, hold_ms: int, mode: str) -> None:
        """Queue `HOLD` (as `hold`) into `pipe`."""
        args: list[str | int] = [token, hold_ms, mode]
        luapipe.add(pipe, self.hold_script, [self.keys.queued(shard)], args)

    def step_in(
        self,
        pipe: redis.client.Pipeline,
        shard: int,
        token: str,
        hold_ms: int,
        now: float,
        lease: float,
        limit: int,
        *,
        renew: bool,
        reap: bool,
        promote: bool,
    ) -> None:
        """Queue `STEP`: one look at a held shard (renew the flag, reap, promote, take up to `limit` ids
        leased until `now + lease`; its reply names the shard's pending revalidation pass, for `refill`)."""
        sk = self.keys.shard(shard)
        args: list[str | int] = [
            token, hold_ms, repr(now), repr(lease), limit,
            "1" if renew else "0", "1" if reap else "0", "1" if promote else "0",
        ]  # fmt: skip
        luapipe.add(pipe, self.step_script, [sk.queued, sk.dirty, sk.inflight, sk.due, sk.revalidate], args)

    def release(self, shard: int, token: str, queued_ttl_ms: int, rearm: bool) -> bool:
        """`RELEASE` the flag of `shard` if `token` holds it; True when it was re-armed (ids remain) and
        the caller must enqueue a job."""
        keys = [self.keys.queued(shard), self.keys.dirty(shard), self.keys.revalidate(shard)]
        return bool(int(self.release_script(keys=keys, args=[token, queued_ttl_ms, "1" if rearm else "0"])))

    def release_in(
        self, pipe: redis.client.Pipeline, shard: int, token: str, queued_ttl_ms: int, rearm: bool
    ) -> None:
        """Queue `RELEASE` (as `release`) into `pipe`."""
        args: list[str | int] = [token, queued_ttl_ms, "1" if rearm else "0"]
        keys = [self.keys.queued(shard), self.keys.dirty(shard), self.keys.revalidate(shard)]
        luapipe.add(pipe, self.release_script, keys, args)


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, str):
        return value
    raise TypeError(f"unexpected Redis reply {value!r}")
