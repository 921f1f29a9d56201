"""Child processes that die with the process that started them, even when it is killed with SIGKILL.

Why this exists: `ipamgc up` (and `demo`), `ipamgc chaos` and `ipamgc bench` start child processes
(redis-server or valkey-server, sentinels, `ipamgc sim serve`, the watcher, the workers, the leaders,
etcd and kube-apiserver, py-spy) and stop them on their way out.  A starter that died without its way
out (SIGKILL, the OOM killer, SIGTERM to `chaos` or `bench`, which keep the default action) left them
running: `up` starts each in a session of its own, so even a kill of up's process group missed them (a
`sim serve` was seen 30 minutes after its `up`: issue 47).  Every place that starts a child that is to
live beside its starter calls `popen` here instead of `subprocess.Popen`.

The mechanism: Linux's parent-death signal.  Between fork and exec the child asks the kernel for SIGKILL
when its parent dies (`prctl(PR_SET_PDEATHSIG)`); the setting survives the exec (it is cleared only by
the exec of a set-uid or set-gid binary), so it holds for redis-server as for a Python component, and the
kernel sends it however the parent dies.  SIGKILL rather than SIGTERM: nobody is left to wait for a
graceful stop, or to kill a child that ignores SIGTERM.  A clean stop is what it was: the starter still
stops its children itself first (SIGTERM, SIGKILL after a grace), and the signal finds none left.

The thread caveat: the kernel sends the signal when the *thread* that forked the child ends, not the
process.  A child forked by a short-lived thread (a chaos failover brings a Redis back from a thread of
its own) would be killed seconds later, with that thread.  So `popen` forks from the main thread (which
ends with the process) when called there, and from one spawner thread that lives as long as the process
when called from any other thread.

Why a `preexec_fn` (CPython warns it is unsafe with threads): the danger is Python code in the child that
needs a lock another thread held at the fork; this one takes none (a ctypes function bound before the
fork, `getppid`, at worst a `kill` of itself; CPython turns the garbage collector off in the child until
the exec).  A wrapper (`python -c` that sets the signal and execs) would cost each child a Python start
(~15 ms of its own CPU, which the benchmark counts) and turn a missing binary's OSError into an exit
status; a pipe the child watches would not do for redis-server.

Where prctl is not available (not Linux), `popen` is `subprocess.Popen`: today's behaviour.
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

DEATH_SIGNAL = signal.SIGKILL
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

Start = Callable[[], "subprocess.Popen[bytes]"]


def _load_prctl() -> Any:
    """libc's prctl, bound now (never in a child between fork and exec); None where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


_PRCTL = _load_prctl()


def supported() -> bool:
    """Whether children started by `popen` die with their parent here."""
    return _PRCTL is not None


def popen(args: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """`subprocess.Popen(args, **kwargs)`, the child killed (SIGKILL) when this process dies."""
    if "preexec_fn" in kwargs:
        raise TypeError("childproc.popen sets preexec_fn itself")
    if _PRCTL is None:
        return subprocess.Popen(args, **kwargs)
    parent = os.getpid()

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(args, preexec_fn=_dies_with(parent), **kwargs)  # noqa: PLW1509 - safe here: the docstring

    if threading.current_thread() is threading.main_thread():
        return start()
    return _SPAWNER.run(start)


def _dies_with(parent: int) -> Callable[[], None]:
    """What the child runs between fork and exec: no lock, no import, no allocation to speak of."""
    prctl, sig = _PRCTL, int(DEATH_SIGNAL)

    def set_death_signal() -> None:
        prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the prctl: no signal will come
            os.kill(os.getpid(), sig)

    return set_death_signal


class _Spawner:
    """The thread that forks for every thread but the main one; it lives as long as the process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._jobs: queue.SimpleQueue[tuple[Start, Future[subprocess.Popen[bytes]]]] = queue.SimpleQueue()

    def run(self, start: Start) -> subprocess.Popen[bytes]:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="ipamgc-spawner", daemon=True)
                self._thread.start()
        done: Future[subprocess.Popen[bytes]] = Future()
        self._jobs.put((start, done))
        return done.result()

    def _serve(self) -> None:
        while True:
            start, done = self._jobs.get()
            try:
                done.set_result(start())
            except BaseException as exc:  # noqa: BLE001 - the caller's to raise, in its own thread
                done.set_exception(exc)


_SPAWNER = _Spawner()
