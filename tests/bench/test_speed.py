"""The benchmark's machine speed probe (`ipamgc.bench.speed`): what it reports, on a fake CPU clock, and
that the workload it times is the same work every time."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ipamgc.bench import speed
from tests.polling import wait_until


def _clock(round_ns: list[int]) -> Iterator[int]:
    """A thread CPU clock whose successive rounds take `round_ns` (read twice per round)."""
    now = 0
    for took in round_ns:
        yield now
        now += took
        yield now


def test_the_probe_is_the_median_round_in_microseconds() -> None:
    ticks = _clock([5_000_000, 1_000_000, 9_000_000, 4_000_000, 3_000_000])
    assert speed.speed_probe(rounds=5, timer=lambda: next(ticks)) == 4_000.0


def test_one_slow_round_does_not_move_it() -> None:
    ticks = _clock([2_000_000, 2_000_000, 50_000_000])  # a round pre-empted or slowed by a neighbour
    assert speed.speed_probe(rounds=3, timer=lambda: next(ticks)) == 2_000.0


def test_at_least_one_round_is_timed() -> None:
    ticks = _clock([7_000_000])
    assert speed.speed_probe(rounds=0, timer=lambda: next(ticks)) == 7_000.0


def test_the_workload_is_the_same_work_every_round() -> None:
    first = speed._workload()
    assert first > 0
    assert speed._workload() == first


def test_on_the_real_clock_it_reports_a_positive_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(speed, "_REPEAT", 2)  # a quick round: the value, not the machine, is tested here
    assert speed.speed_probe(rounds=3) > 0


def test_the_sampler_times_rounds_while_active_and_stops() -> None:
    ticks = iter(range(0, 10**12, 3_000_000))  # every read 3 ms after the last: each round 3,000 µs
    with speed.SpeedSampler(interval=0.01, timer=lambda: next(ticks)) as sampler:
        wait_until(lambda: len(sampler.rounds) >= 3, timeout=10, what="three sampled rounds")
    count = len(sampler.rounds)
    assert sampler.median_us == 3_000.0
    assert not sampler._thread.is_alive()
    assert len(sampler.rounds) == count  # nothing ran after the exit


def test_a_sampler_that_ran_no_round_says_so() -> None:
    with speed.SpeedSampler(interval=60) as sampler:
        pass
    assert sampler.rounds == [] and sampler.median_us is None
