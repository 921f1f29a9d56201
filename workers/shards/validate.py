"""The shard job: validate a shard's dirty allocations with the pure rules and keep the leak timers.

Level-triggered: a job re-reads the current mirror for every id it takes, so duplicated, merged or lost
events are harmless.  Per batch: lease up to `batch_size` dirty ids, load their records, group them by
node, look up node existence, pods and (once mirrored) KubeVirt VMs and VMIs, run
`shared.rules.evaluate_node`, and write the outcome in one
pipeline: candidate timers (persisted, so a restart does not reset them), due times (so a candidate is
re-checked when its grace period ends, with no new event), and release decisions for confirmed leaks.
A gone node is judged on *all* its allocations (its tunnel IPs go only when nothing valid or unknown is
left on it).  Handle all-or-none is the leader's (cross-shard); decisions carry the handle for it.
Nothing happens until the datastore is ready and the mirror has synced: the ids stay dirty.
`validate_shard` drains once and finishes; the RQ entry point `shard_job` lingers instead when the
worker configured it (workers/shards/linger.py: one job serves several shards for up to its budget).

This module drives the jobs (drain, linger, the RQ entry point); judging a taken batch is
`workers.shards.batches`, and the batch's writes are built in workers/shards/writes.py.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import redis
import rq

from redisio.heldconn import HeldConnection
from redisio.shardqueue.jobs import ShardEnqueuer
from redisio.shardqueue.queue import Lease, ShardQueue
from shared.clock import Clock, ServerClock
from shared.errors import TransientError
from shared.keys import Keys
from workers.common.redis_state import GlobalState, ShardReader, read_state
from workers.shards.batches import validate_batches
from workers.shards.job_tuning import (
    LIVE_WORKERS_TTL_SECONDS,
    CachedCount,
    live_workers,
    tuning,
)
from workers.shards.linger import Linger, Lingerer
from workers.shards.pulse import Pulse

log = logging.getLogger("workers.validate")  # its pre-split name (#37): log lines unchanged


@dataclass(slots=True)
class ShardStats:
    shard: int
    batches: int = 0
    validated: int = 0  # verdicts written
    candidates: int = 0
    confirmed: int = 0
    decisions: int = 0  # decisions emitted (a confirmed leak already decided is not re-emitted)
    skipped_malformed: int = 0  # unreadable allocation records: skipped, never decided on
    vanished: int = 0  # dirty ids whose allocation no longer exists
    unknown_lookups: int = 0  # unreadable pod records, treated as pods that exist
    reaped: int = 0
    promoted: int = 0
    gated: bool = False  # datastore not ready or mirror not synced: nothing done
    requeued: bool = False
    # Lingering jobs only (`linger=`): shards adopted, looks at the held shards, idle pulse polls, and
    # whether the job's own shard was held by another live job (it then did nothing).
    adopted: int = 0
    taken_over: int = 0  # of them, taken from a later lingering job (`Linger.concentrate`)
    given_back: int = 0  # shards given back to the queue when busy
    looks: int = 0
    polls: int = 0
    held_elsewhere: bool = False

    def as_dict(self) -> dict[str, int | bool]:
        return asdict(self)


def validate_shard(
    shard: int,
    *,
    client: redis.Redis,
    keys: Keys | None = None,
    clock: Clock | None = None,
    enqueue: Callable[[int], None] | None = None,
    batch_size: int = 1000,
    lease: float = 60.0,
    budget: float = 5.0,
    monotonic: Callable[[], float] = time.monotonic,
    per_node: bool = False,
    linger: Linger | None = None,
    pulse: Pulse | None = None,
) -> ShardStats:
    """Drain shard `shard` until its dirty set is empty or `budget` seconds (monotonic) are spent.

    `lease` (seconds) is how long a taken batch may stay unacked before the reaper hands it to another
    job.  At the end the shard's `queued` flag is cleared and, if ids are still dirty, `enqueue(shard)` is
    called for a fresh job (unless the job was gated).  `per_node` (the benchmark's Calico 3.30
    baseline) writes no due times and promotes none.  With `linger`, the job stays after the shard is
    drained and serves it, and the shards it adopts, until idle, `budget` or a stop
    (workers/shards/linger.py); `pulse` is how it waits for the watcher's pulses (default: a blocking read of
    `P:pulses`).
    """
    keys = keys or Keys()
    clock = clock or ServerClock(client)  # Redis TIME: one clock for every worker host
    if linger is None:
        job = _ShardJob(shard, client, keys, clock, batch_size, lease, per_node)
        return job.run(enqueue, budget, monotonic)
    stats = ShardStats(shard)
    # One connection kept for the job's pipelines (`redisio.heldconn`): a lingering job sends a few a
    # second, each of which would otherwise take a connection from the pool and give it back.
    held = HeldConnection(client)

    def make(s: int) -> _ShardJob:
        job = _ShardJob(s, client, keys, clock, batch_size, lease, per_node, held)
        job.stats = stats
        job.monotonic = monotonic
        return job

    lingerer = Lingerer(
        client,
        keys,
        clock,
        make,
        linger=linger,
        lease=lease,
        batch_size=batch_size,
        budget=budget,
        per_node=per_node,
        monotonic=monotonic,
        pulse=pulse,
        batch=validate_batches,
        held=held,
        enqueue=enqueue,
    )
    try:
        out = lingerer.run(shard)
    finally:
        held.release()
    stats.adopted, stats.looks, stats.polls = out.adopted, out.looks, out.polls
    stats.taken_over, stats.given_back = out.taken_over, out.given_back
    stats.reaped, stats.promoted = out.reaped, out.promoted
    stats.skipped_malformed += out.dropped
    stats.held_elsewhere = out.held_elsewhere
    if out.gated is not None:
        stats.gated = True
        log.info("shard job idle: %s", _why_gated(out.gated), extra={"shard": shard})
    stats.requeued = bool(out.requeued)
    for s in out.requeued:
        if enqueue is not None:
            enqueue(s)
    return stats


class _ShardJob:
    def __init__(
        self,
        shard: int,
        client: redis.Redis,
        keys: Keys,
        clock: Clock,
        batch_size: int,
        lease: float,
        per_node: bool = False,
        held: HeldConnection | None = None,
    ) -> None:
        self.shard = shard
        self.held = held
        self.per_node = per_node
        self.redis = client
        self.keys = keys
        self.clock = clock
        self.batch_size = batch_size
        self.lease = lease
        self.queue = ShardQueue(client, keys, shard)
        self.reader = ShardReader(client, keys, shard, held)
        self.stats = ShardStats(shard)
        self.extra = {"shard": shard}
        self.monotonic: Callable[[], float] = time.monotonic

    def run(
        self, enqueue: Callable[[int], None] | None, budget: float, monotonic: Callable[[], float]
    ) -> ShardStats:
        completed = False
        rearm = True
        self.monotonic = monotonic
        try:
            stop_at = monotonic() + budget
            while True:
                # The job is alive: its `queued` flag now expires one lease from here, so a worker killed
                # between batches (holding no lease for the reaper) frees its shard within a lease, not
                # after QUEUED_TTL_SECONDS; `kick` then re-arms it.  The end of the job clears the flag.
                self.queue.keep_flag(self.lease)
                state = read_state(self.redis, self.keys)
                if not state.ready:
                    self.stats.gated = True
                    rearm = False
                    log.info("shard job idle: %s", _why_gated(state), extra=self.extra)
                    break
                now = self.clock.now()
                self.stats.reaped += self.queue.reap(now, self.batch_size)
                if not self.per_node:
                    self.stats.promoted += self.queue.promote(now, self.batch_size)
                lease = self.queue.take(now, self.lease, self.batch_size)
                self.stats.skipped_malformed += lease.dropped
                if not lease.ids:
                    # Nothing dirty: the next ids of a pass over every allocation, if one is pending.
                    if monotonic() < stop_at and self.queue.refill(self.batch_size):
                        continue
                    break
                self.validate(lease, state, now)
                if monotonic() >= stop_at:
                    break
            completed = True
        finally:
            if not completed:
                # Leave the batch leased (its lease is the back-off); let the next event or kick re-arm.
                with contextlib.suppress(redis.RedisError):
                    self.queue.finish(rearm=False)
        if self.queue.finish(rearm):
            self.stats.requeued = True
            if enqueue is not None:
                enqueue(self.shard)
        return self.stats

    def validate(self, lease: Lease, state: GlobalState, now: float) -> float | None:
        """Validate one taken batch; returns the earliest due time it wrote (None: none)."""
        return validate_batches([(self, lease)], state, now)[0]


def _why_gated(state: GlobalState) -> str:
    if state.problem:
        return f"unreadable state: {state.problem}"
    if not state.datastore_ready:
        return "datastore not ready"
    return "mirror not synced yet"


def shard_job(shard: int, prefix: str = "ipamgc") -> dict[str, int | bool]:
    """The RQ entry point (enqueued by `redisio.shardqueue.jobs.ShardEnqueuer`); lingers when the worker
    configured it (`workers.shards.job_tuning.JobTuning`)."""
    job = rq.get_current_job()
    if job is None:
        raise RuntimeError("shard_job runs inside an RQ worker")
    client = job.connection
    keys = Keys(prefix)
    requeue = ShardEnqueuer(client, keys)

    t = tuning()
    linger = None
    if t.linger:
        served = t.served or (shard,)
        linger = Linger(
            idle=t.idle,
            poll=t.poll,
            served=served,
            workers=CachedCount(
                lambda: live_workers(client, [keys.queue_name(s) for s in served]),
                LIVE_WORKERS_TTL_SECONDS,
                time.monotonic,
            ),
            token=f"j:{job.id}",
        )
    try:
        stats = validate_shard(
            shard,
            client=client,
            keys=keys,
            enqueue=requeue,
            batch_size=t.batch_size,
            lease=t.lease,
            budget=t.linger_budget if t.linger else t.budget,
            per_node=t.per_node,
            linger=linger,
        )
    except redis.RedisError as exc:
        raise TransientError(f"shard {shard}: Redis: {exc}") from exc
    return stats.as_dict()
