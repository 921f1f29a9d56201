"""The one clock: every timestamp ipamgc stores or compares comes from a `Clock` object.

Leak grace periods, candidate timers and work-queue leases are measured on wall time in seconds since the
epoch (they are shared between processes through Redis, so a per-process monotonic clock would not do).
Workers and the leader read Redis's clock (`ServerClock`: one `TIME` a batch or pass), not their host's:
a timer started on one host and confirmed on another whose clock runs ahead would otherwise have its
grace period shortened by the skew.
Domain functions never read a clock; callers pass `now`.  Tests use `FakeClock` and move time forward
with `advance`, so a 15-minute grace period is tested in milliseconds.
"""

from __future__ import annotations

import time
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
    """Redis's clock (`TIME`), one clock for every host that shares the timers.  Each `now()` is one
    round trip, so callers read it once per batch or pass and pass `now` on."""

    def __init__(self, source: TimeSource) -> None:
        self.source = source

    def now(self) -> float:
        seconds, micros = self.source.time()
        return int(seconds) + int(micros) / 1_000_000


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
