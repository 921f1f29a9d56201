"""The watcher's threads carry OS names, and the benchmark reads each one's CPU by that name."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

from lab.bench.procs import thread_cpu_seconds
from producer.threadname import name_this_thread, os_name
from tests.polling import wait_until

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl and /proc are Linux's")


def test_an_os_name_drops_the_prefix_and_keeps_what_the_kernel_keeps() -> None:
    assert os_name("ipamgc-watch-pods") == b"watch-pods"
    assert os_name("ipamgc-watch-ipamblocks") == b"watch-ipamblock"  # 15 bytes
    assert os_name("resync") == b"resync"


def test_a_named_thread_s_cpu_is_read_by_its_name_and_the_main_thread_keeps_the_process_s() -> None:
    process_name = Path(f"/proc/{os.getpid()}/comm").read_text().strip()
    busy_for = 0.05
    ready = threading.Event()
    finish = threading.Event()

    def spin() -> None:
        name_this_thread()
        end = time.thread_time() + busy_for
        while time.thread_time() < end:
            pass
        ready.set()
        finish.wait(10)

    thread = threading.Thread(target=spin, name="ipamgc-test-spin", daemon=True)
    thread.start()
    name_this_thread()  # the main thread: left as it is
    try:
        assert ready.wait(10)
        # The kernel's per-thread account may lag a scheduler tick behind the thread's own clock.
        assert wait_until(lambda: thread_cpu_seconds(os.getpid()).get("test-spin", 0.0) >= busy_for, 10)
        assert thread_cpu_seconds(os.getpid())["main"] > 0
        assert Path(f"/proc/{os.getpid()}/comm").read_text().strip() == process_name
    finally:
        finish.set()
        thread.join(10)


def test_a_process_that_is_gone_has_no_threads() -> None:
    assert thread_cpu_seconds(2**22 + 12345) == {}
