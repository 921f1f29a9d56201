"""Keep large buffers out of the C heap: the watcher's one allocator setting.

A cold start reads list pages of several MB (500 IPAMBlocks are ~4 MB).  glibc serves such a buffer with
its own `mmap` and returns it to the system when freed, but then raises its mmap threshold to the size of
that buffer (up to 32 MB): every later page comes from the heap, and a freed page stays in the process,
where the interpreter's small objects (allocated in arenas of their own) cannot reuse it.  Pinning the
threshold keeps it from moving.  Measured on the watcher alone at 150k pods (docs/benchmarks-history.md), two
runs each: peak RSS to its sync −8 MiB on the code before the watcher's held prints, −7 to −10 MiB with
them (258–262 → 251–252 MiB); its CPU to the sync 7.0 → 7.1–7.2 s.

Pinned at 1 MiB, not at glibc's initial 128 KiB: every buffer above the threshold is a fresh `mmap`,
page-faulted in and unmapped when freed, and the hot path allocates such buffers all the time (a watch
stream is read 256 KiB at a time, a batch's pipeline packs its commands).  On these machines (a
Firecracker VM, where a page fault is dear) a touched 400 KB `bytearray` cost 300 µs mmapped against
12 µs from the heap, and reading 13 KB watch events off a socket 256 KiB at a time 18–20 µs of CPU per
event against 10–11.  List pages of several MB stay above 1 MiB, which is what the pin is for.

`MALLOC_MMAP_THRESHOLD_` in the environment (glibc's own tunable) wins; on a C library other than glibc
(musl in an Alpine image) this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
from collections.abc import Mapping

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
THRESHOLD_BYTES = 1024 * 1024


def pin_mmap_threshold(environ: Mapping[str, str] | None = None) -> bool:
    """Fix glibc's mmap threshold (see the module docstring); whether it was set here."""
    env = os.environ if environ is None else environ
    if "MALLOC_MMAP_THRESHOLD_" in env or "GLIBC_TUNABLES" in env:
        return False  # the operator's choice
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (no `mallopt`)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    done = bool(mallopt(M_MMAP_THRESHOLD, THRESHOLD_BYTES))
    if not done:
        log.debug("mallopt(M_MMAP_THRESHOLD) refused; the allocator's default stays")
    return done
