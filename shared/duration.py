"""Go-style durations ("15m", "15m0s", "1h30m", "500ms"), as Calico writes `leakGracePeriod`."""

from __future__ import annotations

import re

from shared.errors import ConfigError

_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
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
    total = 0.0
    while pos < len(s):
        m = _PART.match(s, pos)
        if m is None:
            raise ConfigError(f"invalid duration {text!r}: expected e.g. 15m, 90s, 1h30m")
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    return total


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
