"""The one clock: every timestamp ipamgc stores or compares comes from a `Clock` object.

Leak grace periods, candidate timers and work-queue leases are measured on wall time in seconds since the
epoch (they are shared between processes through Redis, so a per-process monotonic clock would not do).
Workers and the leader read Redis's clock (`ServerClock`: one `TIME` every few seconds, carried forward on
the host's monotonic clock in between), not their host's wall clock: a timer started on one host and
confirmed on another whose clock runs ahead would otherwise have its grace period shortened by the skew.
Domain functions never read a clock; callers pass `now`.  Tests use `FakeClock` and move time forward
with `advance`, so a 15-minute grace period is tested in milliseconds.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any, Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch."""
        ...


class SystemClock:
    """Wall time (`time.time()`), the clock of every deployed process."""

    def now(self) -> float:
        return time.time()


class TimeSource(Protocol):
    def time(self) -> Any:
        """Redis `TIME`: (seconds, microseconds) — redis-py's reply shape."""
        ...


class ServerClock:
    """Redis's clock (`TIME`), one clock for every host that shares the timers.

    `TIME` is read at most every `resync` seconds; in between, `now()` is the last reading carried
    forward on this host's monotonic clock (a round trip per call was ~15 % of a lingering worker's CPU:
    its loop asks for the time on every poll).  The error is at most half the round trip of the reading
    plus the drift of the host's oscillator over `resync` seconds (tens of ppm: well under a
    millisecond), against grace periods of seconds to minutes.  A host whose wall clock is wrong or steps
    does not matter: only its monotonic clock is used, for the time since the reading.  `now()` never
    goes backward, even when a new reading is a little behind the carried-forward one."""

    def __init__(
        self,
        source: TimeSource,
        *,
        resync: float = 10.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source = source
        self.resync = resync
        self._monotonic = monotonic
        self._read_at = -math.inf  # monotonic time of the last reading (its round trip's midpoint)
        self._server = 0.0  # what the reading said
        self._last = -math.inf

    def now(self) -> float:
        m = self._monotonic()
        if m - self._read_at >= self.resync:
            seconds, micros = self.source.time()
            after = self._monotonic()
            self._server = int(seconds) + int(micros) / 1_000_000
            self._read_at = m + (after - m) / 2
            m = after
        value = self._server + (m - self._read_at)
        if value < self._last:
            return self._last
        self._last = value
        return value


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, start: float = 1_737_481_904.0) -> None:
        self._now = float(start)

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> float:
        """Move forward by `seconds` (never backward); returns the new time."""
        if seconds < 0:
            raise ValueError("a clock does not go backward")
        self._now += seconds
        return self._now
