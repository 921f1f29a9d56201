"""Go-style durations for the leak grace period."""

from __future__ import annotations

import pytest

from shared.duration import format_duration, parse_duration
from shared.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("15m", 900.0),
        ("15m0s", 900.0),
        ("1h30m", 5400.0),
        ("90s", 90.0),
        ("1.5s", 1.5),
        ("500ms", 0.5),
        ("0", 0.0),
        ("0s", 0.0),
        ("2h0m0s", 7200.0),
    ],
)
def test_parse(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["", "15", "-5m", "5 minutes", "m", "1d"])
def test_reject(bad: str) -> None:
    with pytest.raises(ConfigError):
        parse_duration(bad)


@pytest.mark.parametrize(("seconds", "text"), [(900, "15m0s"), (1.5, "1.5s"), (0.25, "250ms"), (0, "0s")])
def test_format(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_go_limits_hold_exactly() -> None:
    """Go sums in int64 nanoseconds: the longest duration is 2^63 - 1 ns, one more is refused, and a
    fraction of a nanosecond is dropped (durationpy accepts past the limit and rounds to µs)."""
    from shared.duration import parse_duration
    from shared.errors import ConfigError

    assert parse_duration("2562047h47m16.854775807s") == (2**63 - 1) / 1e9
    assert parse_duration("9223372036854775807ns") == (2**63 - 1) / 1e9
    for past in ("2562047h47m16.854775808s", "9223372036854775808ns", "2562048h"):
        with pytest.raises(ConfigError, match="longer than"):
            parse_duration(past)
    assert parse_duration("0.0000000001s") == 0.0
    assert parse_duration("1ns") == 1e-9
    assert parse_duration("1.5h") == 5400.0
    for bad in ("1d", "1h-2m", "."):
        with pytest.raises(ConfigError):
            parse_duration(bad)


def test_durationpy_is_still_no_stand_in_for_go() -> None:
    """Why `shared.duration` is ours and not the kept library the kubernetes client ships: durationpy
    parses what Go's `time.ParseDuration` refuses and rounds what Go keeps.  Should a release of it
    parse as Go does, this fails, and `parse_duration` can become a call to it."""
    import durationpy

    accepted_by_durationpy_refused_by_go = ["1d", "1h-2m", "2562047h47m16.854775808s"]
    for text in accepted_by_durationpy_refused_by_go:
        durationpy.from_str(text)  # no error, where Go's ParseDuration (and ours) refuse it
        with pytest.raises(ConfigError):
            parse_duration(text)
    assert durationpy.from_str("1ns").total_seconds() == 0.0  # Go keeps the nanosecond
    assert parse_duration("1ns") == 1e-9
