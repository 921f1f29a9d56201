"""The one clock: every timestamp ipamgc stores or compares comes from a `Clock` object.

Leak grace periods, candidate timers and work-queue leases are measured on wall time in seconds since the
epoch (they are shared between processes through Redis, so a per-process monotonic clock would not do).
Domain functions never read a clock; callers pass `now`.  Tests use `FakeClock` and move time forward
with `advance`, so a 15-minute grace period is tested in milliseconds.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch."""
        ...


class SystemClock:
    """Wall time (`time.time()`), the clock of every deployed process."""

    def now(self) -> float:
        return time.time()


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
