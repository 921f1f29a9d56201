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
