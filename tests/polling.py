"""The one way tests wait: poll a condition until a deadline, never a bare sleep."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest


def wait_until(
    predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02, what: str = "condition"
) -> Any:
    """Poll `predicate` every `interval` s until it returns something truthy; fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not met within {timeout}s")
        time.sleep(interval)  # the polling interval, bounded by the deadline above


def holds_for(
    predicate: Callable[[], Any], seconds: float, interval: float = 0.02, what: str = "condition"
) -> None:
    """Poll `predicate` every `interval` s until `seconds` have passed; fail at the first poll it is false.
    For what must *not* happen within a window (a wake-up, a write): the deadline is the pass."""
    deadline = time.monotonic() + seconds
    while time.monotonic() <= deadline:
        if not predicate():
            pytest.fail(f"{what} stopped holding within {seconds}s")
        time.sleep(interval)  # the polling interval, bounded by the deadline above
