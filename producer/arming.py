"""Arming shards: how work the mirror published reaches the workers as RQ jobs, behind the workers' gate.

Why a module: a shard is "armed" when its `queued` flag is newly set; exactly one job is then enqueued for
it (`enqueue_shards`).  Three things arm shards: a batch of writes that dirtied ids (`producer/sending.py`),
the periodic `kick` (candidates whose grace period ended, leases of dead workers, flags whose job never
started), and the full resync (`mark_all_dirty`, which kicks).  All three stop at the gate this mirror last
wrote (`producer/statehash.py` opens and closes it): while it is shut no job would do anything.  Apart from
the per-kind apply paths of `producer/mirror.py`, which only decide what is dirty.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import redis

from producer.generation import Generation
from producer.redis_scripts import ProducerScripts
from producer.wakeups import KickSchedule
from shared import keys as k
from shared import luapipe
from shared.clock import Clock
from shared.heldconn import HeldConnection
from shared.keys import Keys

# `kick` re-arms a shard whose pending job holds a lease that expired this long ago: its worker was
# killed, and waiting for the `queued` flag to expire (minutes) would stall the shard.  Longer than the
# reaper's own grace, so a live job that is merely slow is rarely duplicated (and a duplicate is harmless).
KICK_STALE_LEASE_SECONDS = 5.0
# `kick` also re-arms a shard whose `queued` flag was set this long ago and that no running job has held
# since (a running job keeps the flag within one work lease): the process that set it died before it
# enqueued the job, or the job waits behind a backlog, where a duplicate costs one job that finds little.
KICK_UNSTARTED_SECONDS = 10.0


@dataclass(slots=True)
class MirrorStats:
    published: int = 0  # ids newly added to a dirty set (repeats of a still-dirty id not counted)
    enqueued: int = 0
    malformed: int = 0  # stored block records that could not be decoded (at load)


class ShardArming:
    """The gate as this mirror wrote it, and the jobs for the shards it arms (see the module docstring)."""

    def __init__(
        self,
        redis_client: redis.Redis,
        keys: Keys,
        shards: int,
        scripts: ProducerScripts,
        stats: MirrorStats,
        enqueue: Callable[[int], None] | None,
        *,
        clock: Clock,
        queued_ttl: float,
        job_lease: float,
        held: HeldConnection | None = None,
    ) -> None:
        self.redis = redis_client
        self.held = held  # the mirror's kept connection, for the kick
        self.keys = keys
        self.shards = shards
        self.scripts = scripts
        self.stats = stats
        self.enqueue = enqueue
        self.clock = clock
        self.queued_ttl = queued_ttl
        self.job_lease = job_lease  # the workers' lease (seconds): how far ahead a running job holds `queued`
        # The workers' gate as this mirror last wrote it (None: not written by this process).  While it
        # is closed (listing, or the datastore not ready) no shard is armed: a job would only find the
        # gate shut.  Opening it (`mark_synced`, `set_config`) kicks every shard with work.
        self.synced: bool | None = None
        self.ready: bool | None = None
        # When the last kick says to kick again (epoch s: the earliest due time ahead, or when a lease held
        # now would count as dead); None: nothing ahead.
        self.next_kick: float | None = None
        self.schedule: KickSchedule | None = None  # the watcher's, told of every kick
        self.generation = Generation()  # the mirror's write generation (shared with the batch sender)
        # Called when a kick finds the mirror gone (the `synced` marker this mirror wrote is absent: Redis
        # restarted empty or flushed).  Every kick checks once the mirror is synced, whoever runs it:
        # the watcher's own kick alone was postponed for ever by the backstop's kicks (each one moves the
        # next kick a `kick_interval` ahead) whenever the backstop ran more often than that interval.
        self.on_lost: Callable[[], None] = lambda: None

    @property
    def gate_open(self) -> bool:
        """Whether the workers' gate is open as far as this mirror wrote it (see `synced`)."""
        return self.synced is not False and self.ready is not False

    def enqueue_shards(self, shards: Sequence[int]) -> None:
        """Hand newly armed shards to the job queue.  If enqueueing fails, drop the `queued` flags not yet
        backed by a job, so the next event (or `kick`) retries instead of the shard stalling."""
        pending = list(shards)
        try:
            while pending:
                if self.enqueue is not None:
                    self.enqueue(pending[0])
                self.stats.enqueued += 1
                pending.pop(0)
        finally:
            if pending:
                self.redis.delete(*(self.keys.queued(s) for s in pending))

    def mark_all_dirty(self, chunk: int = 5000, pause: Callable[[], None] | None = None) -> int:
        """Full resync (the backstop): every allocation dirty, `chunk` ids per round trip per shard.
        `pause` runs between chunks (the watcher throttles with it; an exception it raises aborts)."""
        added = 0
        for shard in range(self.shards):
            cursor = b"0"
            while True:
                if pause is not None and (shard or cursor != b"0"):
                    pause()
                cursor, n = self.scripts.mark_dirty_chunk(
                    keys=[self.keys.alloc(shard), self.keys.dirty(shard)], args=[cursor, chunk]
                )
                added += int(n)
                if cursor == b"0":
                    break
        self.redis.hset(self.keys.state, k.STATE_LAST_FULL_RESYNC, repr(self.clock.now()))
        self.kick()
        return added

    def kick(self, require: str | None = None) -> list[int] | None:
        """Enqueue a job for every shard with work and none pending (dirty ids, due candidates, expired
        leases), and set `next_kick`.  Run it when `next_kick` (or a wakeup) comes: it is what re-checks
        candidates when no event arrives.  Nothing while the gate this mirror wrote is closed: opening it
        kicks.
        `require`: a `state` field read in the same round trip; when it is absent (Redis lost the
        mirror), nothing is enqueued, `on_lost` runs and None is returned.  Once this mirror is synced the
        `synced` field is required whatever the caller asks."""
        if self.schedule is not None:
            self.schedule.kicking()
        if not self.gate_open:
            if self.schedule is not None:
                self.schedule.kicked(None)
            return []
        if require is None and self.synced is True:
            require = k.STATE_SYNCED
        now = repr(self.clock.now())
        ttl_ms = int(self.queued_ttl * 1000)
        hold_ms = int(self.job_lease * 1000)
        unstarted_ms = int(KICK_UNSTARTED_SECONDS * 1000)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hget(self.keys.state, k.STATE_GENERATION)
        if require is not None:
            pipe.hget(self.keys.state, require)
        for s in range(self.shards):
            keys = [self.keys.queued(s), self.keys.dirty(s), self.keys.due(s), self.keys.inflight(s)]
            args: list[str | int | float] = [now, ttl_ms, KICK_STALE_LEASE_SECONDS, unstarted_ms, hold_ms]
            luapipe.add(pipe, self.scripts.kick, keys, args)
        generation, *replies = luapipe.execute(pipe, self.redis, [self.scripts.kick], self.held)
        if require is not None:
            present, *replies = replies
            if present is None:
                if self.schedule is not None:
                    self.schedule.kicked(None)
                self.on_lost()
                return None
        self.generation.seen(None if generation is None else int(generation))
        armed = [s for s, (flag, _) in enumerate(replies) if flag]
        self.next_kick = min((float(at) for _, at in replies if at), default=None)
        if self.schedule is not None:
            self.schedule.kicked(None if self.next_kick is None else self.next_kick - self.clock.now())
        self.enqueue_shards(armed)
        return armed
