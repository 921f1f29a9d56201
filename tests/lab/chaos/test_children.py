"""`ipamgc chaos` sent SIGTERM leaves nothing running: its redis-server and the components die with it
(it has no handler of its own for SIGTERM: it dies at once, its cleanup unrun)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ipamgc import childproc
from tests.children import children_of, cmdline, kill_all, running
from tests.polling import wait_until

ROOT = Path(__file__).resolve().parents[3]


def kind(pid: int) -> str:
    argv = cmdline(pid)
    return argv[2].rsplit(".", 1)[-1] if len(argv) > 2 and argv[1] == "-m" else "redis"


@pytest.mark.skipif(not childproc.supported(), reason="no prctl(PR_SET_PDEATHSIG) here")
def test_chaos_sent_sigterm_leaves_no_child_running(tmp_path: Path) -> None:
    # A small run that would last ten minutes: it is stopped as soon as everything has started.
    with (tmp_path / "chaos.log").open("w") as out:
        chaos = subprocess.Popen(
            [sys.executable, "-m", "ipamgc", "chaos", "--duration", "600", "--nodes", "2",
             "--pods-per-node", "2", "--workers", "1", "--faults", "latency", "--log-dir", str(tmp_path)],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    children: list[int] = []
    try:
        # Its redis-server first, then the watcher, a worker and two leaders.
        def started() -> bool:
            children[:] = children_of(chaos.pid)
            return sorted(map(kind, children)) == ["lead", "lead", "redis", "watch", "work"]

        wait_until(started, 60, interval=0.1, what="chaos to start Redis and the components")
        kinds = {pid: kind(pid) for pid in children}
        chaos.send_signal(signal.SIGTERM)
        chaos.wait(timeout=30)
        wait_until(lambda: not any(map(running, children)), 15, what=f"chaos's children {kinds} to die")
    finally:
        chaos.kill()
        chaos.wait(timeout=10)
        kill_all(children)
