"""The local supervisor behind `ipamgc up` and `ipamgc demo`: every component as its own process.

It provides what a cluster would: Redis (the `--redis-url` given, else `ipamgc.local_redis.EmbeddedRedis`),
a Kubernetes API (the kubeconfig given, else `ipamgc sim serve` on a free loopback port), and it runs the
watcher, N workers and the leader as separate OS processes with their logs in files, restarting any that
exits (a leader that lost its Lease exits on purpose and comes back as a standby), with back-off.  A
component that keeps failing (`GIVE_UP_AFTER_QUICK_EXITS` exits in a row, each within
`QUICK_EXIT_SECONDS` of its start, or one exit with status 2, bad configuration, which no restart can fix)
is reported by `failure()` with the last line of its log, so `up` stops and says why instead of
restarting it for ever.  Every child is started through `ipamgc.childproc`: should `up` die without
stopping them (SIGKILL), they die with it.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ipamgc import childproc

log = logging.getLogger(__name__)

RESTART_BACKOFF_MIN_SECONDS = 0.5
RESTART_BACKOFF_MAX_SECONDS = 10.0
STOP_GRACE_SECONDS = 10.0
QUICK_EXIT_SECONDS = 30.0  # a component that exits sooner than this after its start is failing, not done
GIVE_UP_AFTER_QUICK_EXITS = 4  # ~0.5 + 1 + 2 s of back-off in between: a few seconds, then loud
EXIT_CONFIG = 2  # every component's (and click's) exit status for bad settings


@dataclass
class Component:
    name: str
    argv: list[str]
    restart: bool = True
    proc: subprocess.Popen[bytes] | None = None
    log_file: IO[bytes] | None = None
    starts: int = 0
    exits: list[int] = field(default_factory=list)
    next_start: float = 0.0
    backoff: float = RESTART_BACKOFF_MIN_SECONDS
    started_at: float = 0.0
    down_since: float | None = None
    quick_exits: int = 0  # exits in a row, each sooner than QUICK_EXIT_SECONDS after its start

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


@dataclass
class Supervisor:
    log_dir: Path
    components: dict[str, Component] = field(default_factory=dict)
    clock: Callable[[], float] = time.monotonic
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))

    def add(self, name: str, argv: list[str], restart: bool = True) -> Component:
        comp = Component(name, argv, restart)
        self.components[name] = comp
        self._start(comp)
        return comp

    def _start(self, comp: Component) -> None:
        if comp.log_file is None:
            comp.log_file = (self.log_dir / f"{comp.name}.log").open("ab")
        comp.proc = childproc.popen(
            comp.argv, stdout=comp.log_file, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )
        comp.starts += 1
        comp.started_at = self.clock()
        comp.down_since = None
        log.info("started %s (pid %s)", comp.name, comp.proc.pid, extra={"component": comp.name})

    def poll(self) -> list[str]:
        """Restart components that exited (with back-off); returns the names restarted."""
        restarted = []
        now = self.clock()
        for comp in self.components.values():
            if comp.proc is None:
                continue
            code = comp.proc.poll()
            if code is None:
                if now - comp.started_at > 60:
                    comp.backoff = RESTART_BACKOFF_MIN_SECONDS  # it ran fine for a while
                continue
            if comp.down_since is None:
                comp.down_since = now
                comp.exits.append(code)
                quick = now - comp.started_at < QUICK_EXIT_SECONDS
                comp.quick_exits = comp.quick_exits + 1 if quick else 0
                comp.next_start = now + comp.backoff
                comp.backoff = min(comp.backoff * 2, RESTART_BACKOFF_MAX_SECONDS)
                log.warning("%s exited with %s", comp.name, code, extra={"component": comp.name})
            if comp.restart and now >= comp.next_start:
                self._start(comp)
                restarted.append(comp.name)
        return restarted

    def failure(self) -> str | None:
        """One line naming a component that keeps failing and its last error, else None."""
        for comp in self.components.values():
            if comp.proc is None or comp.proc.poll() is None or not comp.exits:
                continue
            code = comp.exits[-1]
            if code == EXIT_CONFIG or comp.quick_exits >= GIVE_UP_AFTER_QUICK_EXITS:
                times = "once" if comp.quick_exits <= 1 else f"{comp.quick_exits} times in a row"
                last = last_error_line(self.log_dir / f"{comp.name}.log") or "(its log is empty)"
                return f"{comp.name} keeps failing (exited {times}, status {code}): {last}"
        return None

    def stop(self) -> None:
        """SIGTERM everyone, wait, SIGKILL the rest, reap all."""
        for comp in self.components.values():
            if comp.proc is not None and comp.proc.poll() is None:
                comp.proc.send_signal(signal.SIGTERM)
        deadline = self.clock() + STOP_GRACE_SECONDS
        for comp in self.components.values():
            if comp.proc is None:
                continue
            try:
                comp.proc.wait(timeout=max(0.0, deadline - self.clock()))
            except subprocess.TimeoutExpired:
                comp.proc.kill()
                comp.proc.wait()
        for comp in self.components.values():
            if comp.log_file is not None:
                comp.log_file.close()
                comp.log_file = None

    def status(self) -> list[dict[str, Any]]:
        return [
            {"name": c.name, "pid": c.pid, "starts": c.starts, "exits": list(c.exits)}
            for c in self.components.values()
        ]


def last_error_line(path: Path, tail_bytes: int = 16384) -> str:
    """The last line of a log that reads as an error (a traceback's last line, an ERROR record, a
    `…: error: …` message), else its last non-empty line; "" when there is none."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - tail_bytes))
            lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    for line in reversed(lines):
        if " ERROR " in line or " CRITICAL " in line or _ERROR_LINE.match(line):
            return line
    return lines[-1] if lines else ""


# `SomeError: text` (a traceback's last line), `ipamgc watch: text`, `Error: text` (click).
_ERROR_LINE = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Exit)\b|ipamgc \w+:|Error:)")


class SimProcess:
    """`ipamgc sim serve` as a child process; its kubeconfig is written to a temporary file."""

    def __init__(self, log_dir: Path, args: list[str]) -> None:
        self.kubeconfig = str(Path(tempfile.mkdtemp(prefix="ipamgc-sim-")) / "kubeconfig")
        self.log = (log_dir / "sim.log").open("ab")
        self.proc = childproc.popen(
            python_module("ipamgc", "sim", "serve", "--kubeconfig-out", self.kubeconfig, *args),
            stdout=subprocess.PIPE,
            stderr=self.log,
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().decode().strip()
        if not self.url.startswith("http"):
            self.stop()
            raise RuntimeError(f"the simulated cluster did not start (see {log_dir / 'sim.log'})")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.log.close()
