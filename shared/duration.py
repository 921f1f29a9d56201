"""Go-style durations ("15m", "15m0s", "1h30m", "500ms"), as Calico writes `leakGracePeriod`."""

from __future__ import annotations

import re
from decimal import Decimal

from shared.errors import ConfigError

# Nanoseconds per unit: Go sums a duration in int64 nanoseconds, dropping fractions of a nanosecond, and
# refuses one past 2^63 - 1 ns (2562047h47m16.854775807s).  (durationpy, which the kubernetes client
# ships, is no stand-in: it accepts `1d`, `1h-2m` and durations past that limit, and rounds to µs.)
_UNITS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "μs": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_MAX_NS = 2**63 - 1
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def parse_duration(text: str) -> float:
    """Parse a Go duration string into seconds.

    Accepts what Go's `time.ParseDuration` accepts for non-negative values: a sequence of decimal numbers
    each with a unit (ns, us, µs, ms, s, m, h), or a bare "0".  Raises ConfigError otherwise.
    """
    s = text.strip()
    if s in ("0", "+0"):
        return 0.0
    if s.startswith("+"):
        s = s[1:]
    if not s or s.startswith("-"):
        raise ConfigError(f"invalid duration {text!r}: must be a non-negative Go duration such as 15m")
    pos = 0
    total = 0
    while pos < len(s):
        m = _PART.match(s, pos)
        if m is None:
            raise ConfigError(f"invalid duration {text!r}: expected e.g. 15m, 90s, 1h30m")
        total += int(Decimal(m.group(1)) * _UNITS[m.group(2)])  # exact; a fraction of a ns dropped
        if total > _MAX_NS:
            raise ConfigError(f"invalid duration {text!r}: longer than Go's 2562047h47m16.854775807s")
        pos = m.end()
    return total / 1e9


def format_duration(seconds: float) -> str:
    """Render seconds the way Go prints a time.Duration (15m0s, 1.5s, 250ms)."""
    if seconds == 0:
        return "0s"
    if seconds < 1:
        ms = seconds * 1000
        return f"{ms:g}ms"
    hours, rem = divmod(seconds, 3600)
    minutes, secs = divmod(rem, 60)
    out = ""
    if hours:
        out += f"{int(hours)}h"
    if hours or minutes:
        out += f"{int(minutes)}m"
    out += f"{secs:g}s"
    return out
