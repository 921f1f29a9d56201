"""`ipamgc.childproc`: a child started through it dies when its parent dies, even by SIGKILL, and not
when the thread that started it ends (the parent-death signal is the forking thread's)."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from ipamgc import childproc
from tests.children import kill_all, running
from tests.polling import holds_for, wait_until

ROOT = Path(__file__).resolve().parents[2]

# The parent: starts a child through childproc (from its main thread, or from a thread that has ended by
# the time the child's pid is printed), prints the child's pid, and waits for the test to kill it.
PARENT = """
import os, subprocess, sys, threading, time
from ipamgc import childproc

argv = sys.argv[2:]
quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL}  # never holds the test's pipes
if sys.argv[1] == "thread":
    started = []
    thread = threading.Thread(target=lambda: started.append(childproc.popen(argv, **quiet)))
    thread.start()
    thread.join()
    deadline = time.monotonic() + 5  # until the OS thread is gone: when a thread-bound signal would be sent
    while str(thread.native_id) in os.listdir("/proc/self/task") and time.monotonic() < deadline:
        threading.Event().wait(0.01)  # the poll interval, bounded by the deadline
    child = started[0]
else:
    child = childproc.popen(argv, **quiet)
print(child.pid, flush=True)
sys.stdin.read()  # until the test kills this process (or, should the test die, its pipe closes)
"""
CHILD = [sys.executable, "-c", "import signal; signal.pause()"]  # runs until a signal ends it

pytestmark = pytest.mark.skipif(not childproc.supported(), reason="no prctl(PR_SET_PDEATHSIG) here")


@contextlib.contextmanager
def parent_and_child(mode: str) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, mode, *CHILD], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    child = 0
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        yield parent, child
    finally:
        kill_all([child] if child else [])
        parent.kill()
        parent.communicate(timeout=10)


def test_the_child_dies_when_its_parent_is_killed() -> None:
    with parent_and_child("main") as (parent, child):
        assert running(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        wait_until(lambda: not running(child), 10, what=f"child {child} to die with its parent")


def test_the_child_outlives_the_thread_that_started_it_but_not_its_parent() -> None:
    with parent_and_child("thread") as (parent, child):
        holds_for(lambda: running(child), 1.0, what=f"child {child} running after its thread ended")
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        wait_until(lambda: not running(child), 10, what=f"child {child} to die with its parent")


def test_popen_is_popen() -> None:
    """What callers rely on: the Popen they asked for, its errors unchanged."""
    done = childproc.popen([sys.executable, "-c", "print('hi')"], stdout=subprocess.PIPE)
    assert done.communicate(timeout=30) == (b"hi\n", None)
    assert done.returncode == 0
    with pytest.raises(FileNotFoundError):
        childproc.popen(["/nonexistent/redis-server"])
    errors: list[BaseException] = []

    def start() -> None:  # from a thread other than the main one: through the spawner thread
        try:
            childproc.popen(["/nonexistent/redis-server"])
        except FileNotFoundError as exc:
            errors.append(exc)

    thread = threading.Thread(target=start)
    thread.start()
    thread.join(timeout=30)
    assert [type(e) for e in errors] == [FileNotFoundError]
