"""An OS name for each of the watcher's threads, so that `top -H`, `ps -L`, py-spy and `/proc/<pid>/task`
tell them apart.

Why: the watcher is the one ipamgc process whose CPU is spread over several threads (a publisher, a watch
thread per kind, the resync), and Python 3.11 names only its own `Thread` objects: to the kernel every one
of them is `python`.  `ipamgc bench` reads each thread's CPU by this name (`watcher_threads_cpu_seconds`),
which is how the watcher's cost per pod event is split between publishing and reading the watches.

The name is the thread's, without the `ipamgc-` prefix, cut to the 15 bytes the kernel keeps
(`watch-pods`, `watch-ipamblock`, `resync`).  The main thread (the publisher) keeps the process's name,
which `ps` and `top` show as the command.  Best effort: on another system, or without `prctl`, nothing
happens.
"""

from __future__ import annotations

import ctypes
import sys
import threading

_PR_SET_NAME = 15  # linux/prctl.h
_KERNEL_NAME_BYTES = 15  # TASK_COMM_LEN - 1


def os_name(name: str) -> bytes:
    """What the kernel is told for a thread named `name`."""
    return name.removeprefix("ipamgc-").encode()[:_KERNEL_NAME_BYTES]


def name_this_thread() -> None:
    """Give the calling thread (not the main one) its OS name."""
    thread = threading.current_thread()
    if thread is threading.main_thread() or not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_NAME, ctypes.c_char_p(os_name(thread.name)), 0, 0, 0)
    except (OSError, AttributeError):
        pass
