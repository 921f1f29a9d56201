"""Process-wide settings of the shard jobs a worker runs: their tuning, the stop request, the live workers.

Its own module because this is state of the worker process, not of one job: `ipamgc work`
(`workers.shards.run`) sets the tuning once and requests the stop from its signal path; the RQ entry point
(`workers.validate.shard_job`) reads them for every job it starts, and a lingering job
(`workers.shards.linger`) polls the stop request.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import redis

from workers.shards.pulse import POLL_SECONDS

# Set by the worker's SIGTERM/SIGINT path (workers/shards/run.py); a lingering job ends within one `poll`.
# Only `is_set` is called from the job (no lock taken in the main thread, so setting it from a signal handler
# cannot deadlock).
_stop = threading.Event()


def request_stop() -> None:
    _stop.set()


def clear_stop() -> None:
    _stop.clear()


def stop_requested() -> bool:
    return _stop.is_set()


@dataclass(frozen=True, slots=True)
class JobTuning:
    """How the shard jobs of this process run (`validate_shard`'s arguments); set by the worker entry.
    The default (what a bare RQ worker gets) drains once and finishes; `ipamgc work` lingers."""

    batch_size: int = 1000
    lease: float = 60.0
    budget: float = 5.0  # a draining job's budget
    linger: bool = False
    # A lingering job's whole life, well under JOB_TIMEOUT_SECONDS (120).  Each job costs its worker RQ's
    # bookkeeping and the watcher an enqueue: at 1 pod event/s with a 30 s life, RQ's part of a job was
    # 19-40 % of the workers' py-spy samples (docs/benchmarks.md, "Every rate with real-size pods").
    linger_budget: float = 90.0
    idle: float = 10.0
    poll: float = POLL_SECONDS  # what `ipamgc work` runs with (`Linger.poll`'s default too)
    served: tuple[int, ...] = ()  # the shards this worker serves (adoptable); () = only the job's own
    per_node: bool = False  # the benchmark's per-node baseline: no due times, no promotion


_tuning = JobTuning()


def configure_jobs(tuning: JobTuning) -> None:
    """Set the tuning of every shard job this process runs from now on."""
    global _tuning  # noqa: PLW0603 - one process-wide setting, written once at worker start
    _tuning = tuning


def tuning() -> JobTuning:
    return _tuning


# How long a count of live workers is trusted: the fair share follows workers that come and go within
# this, and a lingering job does not ask Redis at every adopt look, every 2 s (its two commands were 4–8 %
# of an active worker's py-spy samples).
LIVE_WORKERS_TTL_SECONDS = 10.0


class CachedCount:
    """`count()` at most once per `ttl` seconds (monotonic); the last answer in between."""

    def __init__(self, count: Callable[[], int], ttl: float, monotonic: Callable[[], float]) -> None:
        self._count, self._ttl, self._monotonic = count, ttl, monotonic
        self._value = 0
        self._at = -math.inf

    def __call__(self) -> int:
        m = self._monotonic()
        if m - self._at >= self._ttl:
            self._value, self._at = self._count(), m
        return self._value


def live_workers(client: redis.Redis, queue_names: Sequence[str]) -> int:
    """RQ workers registered on any of `queue_names` whose worker key is still alive (two commands)."""
    members = client.sunion([f"rq:workers:{name}" for name in queue_names])
    return int(client.exists(*members)) if members else 0
