"""How a lingering shard job is tuned (`Linger`) and what it counts (`LingerStats`).

Their own module so that the job's loop (`workers.shards.linger`) stays one room: the worker's entry builds
a `Linger` from its settings (`workers.shards.validate`), the tests build their own.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from workers.common.redis_state import GlobalState
from workers.shards.job_tuning import stop_requested
from workers.shards.pulse import POLL_SECONDS


@dataclass(frozen=True, slots=True)
class Linger:
    """How a shard job lingers (see the module docstring); seconds unless said otherwise."""

    idle: float = 10.0  # no work for this long: end (an idle cluster then runs no job)
    # The longest single wait for a pulse (a blocking XREAD; a stop request is seen within one).
    poll: float = POLL_SECONDS
    # Look at every held shard at least this often (a missed pulse).  Once per period a look also renews
    # the flags and reaps expired leases (under `kick`'s 5 s stale-lease slack, so kick does not re-arm
    # a held shard): these chores ride on the looks pulses cause and never wake a busy job themselves.
    backstop: float = 2.5
    # Adopt free shards at most this often, at a look (adoption never wakes a job by itself).
    adopt_every: float = 2.0
    served: tuple[int, ...] = ()  # shards this worker serves, which the job may adopt
    # Concentration: a job busy less than `light_below` of the time (its looks' wall time over the last
    # `adopt_every`) gathers every served shard, free ones and those of later-token lingering jobs, so
    # that at light load one job wakes per pulse, not one per worker (each wake is an XREAD and four
    # round trips however little it validates).  Busy more than `heavy_above`, it gives back the shards
    # beyond its fair share (re-armed and enqueued: another worker's job takes them).  Between the two
    # it keeps what it holds (hysteresis: gathering two light jobs' shards about doubles the load).
    concentrate: bool = True
    light_below: float = 0.15
    heavy_above: float = 0.6
    workers: Callable[[], int] | None = None  # live workers serving `served` (None: 1)
    token: str = field(default_factory=lambda: f"j:{uuid.uuid4().hex}")
    stop: Callable[[], bool] = stop_requested


@dataclass(slots=True)
class LingerStats:
    looks: int = 0
    polls: int = 0
    adopted: int = 0
    reaped: int = 0
    promoted: int = 0
    dropped: int = 0
    gated: GlobalState | None = None
    held_elsewhere: bool = False  # the job's own shard was held by another live job: it did nothing
    taken_over: int = 0  # shards gathered from later-token lingering jobs (concentration)
    given_back: int = 0  # shards given back past the fair share when busy
    requeued: list[int] = field(default_factory=list)
