"""The worker process: an RQ worker on the shard queues, running shard jobs with the msgpack serializer.

It is `rq.SimpleWorker`, which runs each job in the worker process, not the default forking `Worker`:
- cost: a fork per job is ~20 ms against ~4 ms (design.md, measured here), and a shard job is short
  (one to a few batches of up to `batch_size` ids, at most `job_budget_seconds`), so forking would
  dominate;
- isolation is not needed from fork: jobs are our own code on msgpack data (never unpickled), memory
  per job is bounded by the batch, and a worker that dies mid-batch loses nothing — its lease expires
  and the reaper hands the batch to the next job.  The job timeout still applies (SIGALRM in the main
  thread).
Scale out by running more processes (`ipamgc work` replicas), not threads.  Queues are served round
robin, so one busy shard (its job re-enqueues itself after its time budget) cannot starve the others.
"""

from __future__ import annotations

import importlib
import logging
import signal
import threading
import time
from collections.abc import Sequence
from typing import Any

import redis
import rq
from rq.job import Job
from rq.queue import Queue
from rq.worker import DequeueStrategy

from redisio.client import redis_client
from redisio.shardqueue.jobs import SHARD_JOB, MsgpackSerializer, ShardJob, shard_queue
from shared.config import Settings
from shared.errors import ConfigError
from workers.shards.job_tuning import JobTuning, clear_stop, configure_jobs, request_stop

log = logging.getLogger("workers.run")  # its pre-split name (#37): log lines unchanged

_Handler = Any  # what signal.getsignal returns: a callable, an int, or None
# Seconds between looks of a worker's command-channel thread at its stop flag (`_Worker.subscribe`): the
# longest a worker's exit waits for it (well inside Kubernetes' 30 s termination grace).  Each look is a
# wake-up of the idle floor: at one a second it was about a third of an idle worker's py-spy samples.
PUBSUB_POLL_SECONDS = 5.0


def parse_shards(text: str, shards: int) -> list[int]:
    """`0,1,5-7` → [0, 1, 5, 6, 7]; every shard must be below `shards`."""
    chosen: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        first, sep, last = part.partition("-")
        try:
            lo, hi = int(first), int(last) if sep else int(first)
        except ValueError:
            raise ConfigError(f"bad shard list {text!r}: expected e.g. 0,1,5-7") from None
        if lo > hi:
            raise ConfigError(f"bad shard range {part!r}")
        chosen.extend(range(lo, hi + 1))
    check_shards(chosen, shards)
    return sorted(set(chosen))


def check_shards(chosen: Sequence[int], shards: int) -> None:
    if not chosen:
        raise ConfigError("no shard selected")
    bad = [s for s in chosen if not 0 <= s < shards]
    if bad:
        raise ConfigError(f"shards {bad} outside 0..{shards - 1}")


def run_workers(
    settings: Settings,
    shards: Sequence[int] | None = None,
    burst: bool = False,
    *,
    name: str | None = None,
    rq_log_level: str | None = None,
    stop_pending: threading.Event | None = None,
) -> bool:
    """Work the queues of `shards` (default: every shard) until stopped (SIGTERM/SIGINT: after the
    current job), or, with `burst`, until they are empty.  Returns whether any job was run.
    `rq_log_level`: RQ's own loggers' level (default: the root logger's).  `stop_pending`: set by a
    caller's own SIGTERM handler before RQ's are installed (`ipamgc combined` starts threads first): a stop
    asked for then is honoured once they are, before any job is taken."""
    chosen = list(range(settings.shards)) if shards is None else list(shards)
    check_shards(chosen, settings.shards)
    configure_jobs(
        JobTuning(
            batch_size=settings.batch_size,
            lease=settings.work_lease_seconds,
            budget=settings.job_budget_seconds,
            idle=settings.job_idle_seconds,
            linger=not burst,  # a burst run ends when the queues are empty: its jobs must not wait
            served=tuple(chosen),
            per_node=settings.per_node,
        )
    )
    clear_stop()
    # The one job's module, imported now rather than by RQ inside the first job: 80–130 ms of every
    # worker's first job otherwise (measured here), on the path of the first batch after a start or a
    # cold start; and an install that cannot import it fails here, before taking a job.
    importlib.import_module(SHARD_JOB.rpartition(".")[0])
    keys = settings.keys
    client = redis_client(settings.redis_url)
    saved = _signal_handlers()
    try:
        queues = [shard_queue(client, keys, s) for s in chosen]
        worker = _Worker(
            queues, connection=client, serializer=MsgpackSerializer, job_class=ShardJob, name=name
        )
        worker.stop_pending = stop_pending
        log.info("working shards %s", ",".join(map(str, chosen)), extra={"prefix": keys.prefix})
        # RQ sets its own loggers to INFO (a few lines per job) unless told the level: honour ours.
        level = rq_log_level or logging.getLevelName(logging.getLogger().getEffectiveLevel())
        return bool(
            worker.work(burst=burst, dequeue_strategy=DequeueStrategy.ROUND_ROBIN, logging_level=level)
        )
    finally:
        client.close()
        _restore(saved)


# A worker retries its registration and its dequeue while Redis fails, backing off between these bounds.
REDIS_RETRY_MIN_SECONDS = 0.1
REDIS_RETRY_MAX_SECONDS = 2.0
# Redis errors that say "not now" (no master, a lost connection, a refusal at maxmemory), not a bug.
REDIS_UNAVAILABLE = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.exceptions.OutOfMemoryError,
    redis.exceptions.ReadOnlyError,
)


class _Worker(rq.SimpleWorker):
    """SimpleWorker runs the job in its main thread and stops only after it returns: tell a lingering
        job (workers/shards/linger.py) about the stop request, so it ends within one poll and releases its
    shards."""

    stop_pending: threading.Event | None = None  # `run_workers`' `stop_pending`

    def request_stop(self, signum: int, frame: Any) -> None:
        request_stop()
        super().request_stop(signum, frame)  # type: ignore[no-untyped-call]

    def _install_signal_handlers(self) -> None:
        """RQ's handlers, then a stop asked for before they were installed: the loop ends at its top
        (RQ's `_stop_requested`, the flag its SIGTERM handler sets while a job runs), before a dequeue."""
        super()._install_signal_handlers()  # type: ignore[no-untyped-call]
        if self.stop_pending is not None and self.stop_pending.is_set():
            self.log.info(
                "Worker %s: stopping: asked to before its signal handlers were installed", self.name
            )
            request_stop()
            self._stop_requested = True

    def execute_job(self, job: Job, queue: Queue) -> None:
        """RQ's, going on when Redis fails while RQ records the job's outcome (or a heartbeat).

        Why: RQ's work loop quits the process on any error but a dequeue's connection error ("found an
        unhandled exception, quitting"), so a master killed in a failover, or a Redis at its maxmemory
        refusing RQ's bookkeeping (`OOM command not allowed`), made every worker busy at that moment exit
        and restart.  Nothing is lost by going on: the shard job's lease expires and the watcher arms the
        shard again (the job's own Redis errors are already a `TransientError`); the next dequeue waits for
        Redis as RQ does."""
        try:
            super().execute_job(job, queue)
        except REDIS_UNAVAILABLE as exc:
            self.log.warning("Worker %s: Redis failed recording job %s: %s; going on", self.name, job.id, exc)

    def check_for_suspension(self, burst: bool) -> None:
        """RQ's, going on when Redis fails (the top of RQ's loop; its dequeue then waits for Redis)."""
        try:
            super().check_for_suspension(burst)
        except REDIS_UNAVAILABLE as exc:
            self.log.warning("Worker %s: suspension not checked: %s", self.name, exc)

    def run_maintenance_tasks(self) -> None:
        """RQ's, skipped this time when Redis fails (it runs again at its interval)."""
        try:
            super().run_maintenance_tasks()  # type: ignore[no-untyped-call]
        except REDIS_UNAVAILABLE as exc:
            self.log.warning("Worker %s: maintenance skipped: %s", self.name, exc)

    def dequeue_job_and_maintain_ttl(self, timeout: int | None, max_idle_time: int | None = None) -> Any:
        """RQ's, retried with a back-off while Redis fails (RQ retries a lost connection inside, but not
        every Redis call of it: its state write quits the process), until a stop is requested."""
        delay = REDIS_RETRY_MIN_SECONDS
        while True:
            try:
                return super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
            except REDIS_UNAVAILABLE as exc:
                if self._stop_requested:
                    return None  # RQ's loop ends
                self.log.warning("Worker %s: Redis: %s; retrying in %.1fs", self.name, exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, REDIS_RETRY_MAX_SECONDS)

    def register_birth(self) -> None:
        """RQ's, retried with a back-off while Redis fails: a worker started during a failover (or while
        Redis refuses writes at its maxmemory) waits for it instead of exiting."""
        delay = REDIS_RETRY_MIN_SECONDS
        while True:
            try:
                super().register_birth()  # type: ignore[no-untyped-call]
                return
            except REDIS_UNAVAILABLE as exc:
                self.log.warning("Worker %s: Redis: %s; retrying in %.1fs", self.name, exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, REDIS_RETRY_MAX_SECONDS)

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        """RQ's, going on when Redis fails (RQ's loop calls it after each job: see `execute_job`)."""
        try:
            super().heartbeat(timeout, pipeline)
        except REDIS_UNAVAILABLE as exc:
            self.log.warning("Worker %s: heartbeat not written: %s", self.name, exc)

    def subscribe(self) -> None:
        """RQ's own, with its command channel's thread polling every `PUBSUB_POLL_SECONDS` instead of 60 s.

        Why: at exit RQ unsubscribes and then stops the thread, and redis-py 8.2's `stop()` joins it with
        no timeout.  A thread that read the UNSUBSCRIBE reply before the stop flag was cleared waits up
        to its poll period for a new subscription before it looks at the flag again, so one exit in two
        (measured here on `--burst` runs) took a whole minute: past Kubernetes' 30 s grace period."""
        self.log.info("Worker %s: subscribing to channel %s", self.name, self.pubsub_channel_name)
        self.pubsub = self.connection.pubsub()
        self.pubsub.subscribe(**{self.pubsub_channel_name: self.handle_payload})
        self.pubsub_thread = self.pubsub.run_in_thread(  # type: ignore[assignment] # RQ declares it None
            sleep_time=PUBSUB_POLL_SECONDS, daemon=True, exception_handler=self._pubsub_exception_handler
        )


def _signal_handlers() -> dict[int, _Handler]:
    """RQ installs SIGTERM/SIGINT handlers; remember the caller's so an in-process run leaves no trace."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}


def _restore(saved: dict[int, _Handler]) -> None:
    for sig, handler in saved.items():
        signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
