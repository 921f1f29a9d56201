"""Arming shards: how work the mirror published reaches the workers as RQ jobs, behind the workers' gate.

The protocol (the `queued` flag, the `KICK` script, the job) is the shard queue's, `redisio.shardqueue`;
this module is the watcher's use of it: when to kick, behind which gate, and what a kick tells the
watcher (its schedule, the generation, a lost mirror).

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
from redisio import luapipe
from redisio.heldconn import HeldConnection
from redisio.shardqueue.queue import ShardFlags
from shared import keys as k
from shared.clock import Clock
from shared.keys import Keys


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
        self.flags = ShardFlags(redis_client, keys)  # the shard queue's protocol: `kick`, `disarm`
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
        # This watcher started on a Redis not marked synced (`Mirror.revalidate_when_synced`): opening the
        # gate starts a pass over every allocation (`P:revalidate:{s}`), and until then a first list into
        # an empty memory writes no dirty ids (`BatchSender.send`).
        self.revalidate = False
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
            self.flags.disarm(pending)

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
        pipe = self.redis.pipeline(transaction=False)
        pipe.hget(self.keys.state, k.STATE_GENERATION)
        if require is not None:
            pipe.hget(self.keys.state, require)
        for s in range(self.shards):
            self.flags.kick_in(pipe, s, now, ttl_ms, hold_ms)
        generation, *replies = luapipe.execute(pipe, self.redis, [self.flags.kick_script], self.held)
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
