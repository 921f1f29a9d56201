"""`ServerClock`: Redis's `TIME`, read every `resync` seconds and carried forward on the monotonic clock."""

from __future__ import annotations

import pytest

from shared.clock import ServerClock


class _Source:
    """A Redis `TIME` whose server clock is `offset` seconds from the host's monotonic one."""

    def __init__(self, mono: list[float], offset: float, rtt: float = 0.0) -> None:
        self.mono, self.offset, self.rtt, self.reads = mono, offset, rtt, 0

    def time(self) -> tuple[int, int]:
        self.reads += 1
        at = self.mono[0] + self.rtt / 2 + self.offset  # the server answers mid-way
        self.mono[0] += self.rtt
        seconds = int(at)
        return seconds, round((at - seconds) * 1_000_000)


def test_time_is_read_once_per_resync_and_carried_forward_in_between() -> None:
    mono = [100.0]
    source = _Source(mono, offset=1_700_000_000.0)
    clock = ServerClock(source, resync=10.0, monotonic=lambda: mono[0])
    assert clock.now() == pytest.approx(1_700_000_100.0, abs=1e-6)
    for step in range(1, 10):
        mono[0] = 100.0 + step
        assert clock.now() == pytest.approx(1_700_000_100.0 + step, abs=1e-6)
    assert source.reads == 1
    mono[0] = 110.0
    assert clock.now() == pytest.approx(1_700_000_110.0, abs=1e-6)
    assert source.reads == 2


def test_a_slow_reading_is_placed_at_its_round_trips_midpoint() -> None:
    mono = [50.0]
    source = _Source(mono, offset=1_000.0, rtt=0.2)
    clock = ServerClock(source, resync=10.0, monotonic=lambda: mono[0])
    # The server said 1050.1 at monotonic 50.1; it is now 50.2 on the host.
    assert clock.now() == pytest.approx(1_050.2, abs=1e-6)
    mono[0] = 55.0
    assert clock.now() == pytest.approx(1_055.0, abs=1e-6)


def test_the_server_clock_moves_and_now_follows_at_the_next_reading_never_backward() -> None:
    mono = [0.0]
    source = _Source(mono, offset=2_000.0)
    clock = ServerClock(source, resync=5.0, monotonic=lambda: mono[0])
    assert clock.now() == pytest.approx(2_000.0)
    source.offset += 60.0  # the Redis host's clock is stepped forward: seen at the next reading
    mono[0] = 4.0
    assert clock.now() == pytest.approx(2_004.0)
    mono[0] = 5.0
    assert clock.now() == pytest.approx(2_065.0)
    mono[0] = 9.9
    assert clock.now() == pytest.approx(2_069.9)
    source.offset -= 0.5  # a reading behind what was carried forward and returned: time holds still
    mono[0] = 10.0
    assert clock.now() == pytest.approx(2_069.9)
    assert source.reads == 3
    mono[0] = 10.2
    assert clock.now() == pytest.approx(2_069.9)
    mono[0] = 11.0
    assert clock.now() == pytest.approx(2_070.5)


def test_the_host_wall_clock_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    mono = [10.0]
    clock = ServerClock(_Source(mono, offset=5_000.0), monotonic=lambda: mono[0])
    monkeypatch.setattr(time, "time", lambda: 0.0)
    assert clock.now() == pytest.approx(5_010.0)
