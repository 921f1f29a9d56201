"""The benchmark's CPU per process: exact nanoseconds per thread, ticks only where a thread ended."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

from lab.bench.procs import CpuSample, cpu_delta, cpu_sample

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_thread_started_and_still_running_between_two_samples_is_counted_exactly() -> None:
    spun = threading.Event()
    finish = threading.Event()

    def work() -> None:
        _spin(0.03)
        spun.set()
        finish.wait(10)

    start = cpu_sample(os.getpid())
    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    try:
        assert spun.wait(10)
        _spin(0.02)  # the main thread too
        end = cpu_sample(os.getpid())
        seconds, exact = cpu_delta(start, end)
        assert exact
        assert thread.native_id in end.threads and thread.native_id not in start.threads
        # Both spins, and what little else ran: not a 10 ms tick's multiple.
        assert 0.05 <= seconds < 0.5
        assert seconds == sum(ns - start.threads.get(t, 0) for t, ns in end.threads.items()) / 1e9
    finally:
        finish.set()
        thread.join(10)


def test_a_thread_that_ended_between_two_samples_falls_back_to_the_ticks() -> None:
    finish = threading.Event()
    thread = threading.Thread(target=lambda: (_spin(0.03), finish.wait(10)), daemon=True)
    thread.start()
    start = cpu_sample(os.getpid())
    assert thread.native_id in start.threads
    finish.set()
    thread.join(10)
    _spin(0.02)
    end = cpu_sample(os.getpid())
    seconds, exact = cpu_delta(start, end)
    assert not exact
    assert seconds == pytest.approx(end.ticks - start.ticks)


def test_a_reaped_child_falls_back_to_the_ticks_and_a_gone_process_counts_nothing() -> None:
    start = CpuSample(1.0, 0.0, {1: 10**9})
    end = CpuSample(1.5, 0.2, {1: 10**9 + 100})
    assert cpu_delta(start, end) == (0.5, False)
    assert cpu_delta(start, CpuSample(1.5, 0.0, {1: 10**9 + 5 * 10**8})) == (0.5, True)
    gone = cpu_sample(2**22 + 12345)
    assert gone == CpuSample(0.0)
    assert cpu_delta(start, gone) == (0.0, False)
