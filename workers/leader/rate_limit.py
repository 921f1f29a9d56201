"""The leader's releases-per-second limit.

Its own module because it is policy, not mechanism: Calico's library has no limit on releases, only its
client's QPS, so the limit is ours (`LeaderSettings.rate_limit`), applied by the leader's gate before a
handle's IPs go, and kept apart from the code that writes them.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class TokenBucket:
    """Releases per second (Calico has none for releases, only its client QPS): `rate` tokens a second,
    up to `burst`; rate 0 is unlimited."""

    def __init__(
        self, rate: float, burst: float | None = None, monotonic: Callable[[], float] = time.monotonic
    ):
        self.rate = rate
        self.burst = max(1.0, burst if burst is not None else rate)
        self.monotonic = monotonic
        self._tokens = self.burst
        self._at = monotonic()

    def _refill(self) -> None:
        now = self.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now

    def take(self, n: int) -> bool:
        """Take `n` tokens if there are enough (a request larger than the burst waits for a full bucket)."""
        if self.rate <= 0:
            return True
        self._refill()
        need = min(float(n), self.burst)
        if self._tokens + 1e-9 < need:
            return False
        self._tokens -= need
        return True

    def available(self) -> float:
        """Tokens that `take` could have now (infinite when unlimited)."""
        if self.rate <= 0:
            return float("inf")
        self._refill()
        return self._tokens

    def wait_for(self, n: int) -> float:
        """Seconds until `take(n)` can succeed."""
        if self.rate <= 0:
            return 0.0
        self._refill()
        need = min(float(n), self.burst)
        return max(0.0, (need - self._tokens) / self.rate)
