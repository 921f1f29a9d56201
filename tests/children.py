"""Processes as Linux's /proc shows them, for the tests that check what outlives its starter: a
process's children, whether one still runs, and what it runs."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable
from pathlib import Path


def _stat(pid: int | str) -> list[str] | None:
    """`/proc/<pid>/stat`'s fields after the command name (state first), None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()  # the command name may hold spaces and parentheses


def children_of(pid: int) -> list[int]:
    """The processes whose parent is `pid` now."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat(entry)) is not None and int(fields[1]) == pid:
            found.append(int(entry))
    return sorted(found)


def running(pid: int) -> bool:
    """Whether `pid` runs: a zombie does not (a killed orphan may wait a while for its reaper)."""
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def kill_all(pids: Iterable[int]) -> None:
    """SIGKILL whatever of `pids` still runs (a failed test's leftovers)."""
    for pid in pids:
        if running(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
