"""One process runner for every component (`ipamgc watch`, `work`, `lead`): kopf's `operator()`.

What a component process does beside its work is the same for the three and is done here, once: the
stop signals (SIGTERM, SIGINT) handed to the component, the metrics server with its health endpoints
(`ipamgc/metrics.py`, `ipamgc/healthz.py`) answering from the component's probe, the heartbeat in Redis
(`P:health:<component>:<instance>`) from the same probe, what the start made frozen out of the cyclic
collector's reach (`settle_collector`), the run, and the teardown in reverse order
(heartbeat deleted, the component's own background stopped, the server closed, the component closed).
A configuration error anywhere in that is one line, `ipamgc <command>: <why>`, and exit status 2.

Each command keeps only what is its own: its flags and settings, and a `Process` — how to run it, how to
stop it, what it serves beside the runner's (`serving`), how its health is judged (`probe`) — opened by a
context manager that owns its clients.  The exit status is the one `Process.run` returns.
"""

from __future__ import annotations

import gc
import signal
import sys
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from types import FrameType
from typing import NoReturn, Protocol

import click
import redis
from prometheus_client.registry import Collector

from ipamgc.metrics import Heartbeat, MetricsServer, resolve_metrics_host, serve_metrics
from shared.errors import ConfigError
from shared.keys import Keys

EXIT_CONFIG = 2  # a configuration error, as every command's
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Background(Protocol):
    """Something a component runs beside its work while it is served (the watcher's metrics reader)."""

    def start(self) -> object: ...

    def stop(self) -> None: ...


class Process:
    """A component as the runner runs it; each command subclasses it with what is its own.

    `component` names it for the metrics server and the heartbeat (`watcher`, `worker`, `leader`);
    `redis` is the client the heartbeat writes with (the component's own)."""

    component: str = ""
    # False: the component installs its own stop signals (RQ's worker does), the runner none.
    handles_stop_signals: bool = True

    def __init__(self, client: redis.Redis) -> None:
        self.redis = client

    def probe(self) -> tuple[bool, str]:
        """Whether the main loop comes round, and a word on its state: `/healthz`, `/readyz` and the
        heartbeat.  Default: alive while running."""
        return True, "running"

    def beat_probe(self) -> tuple[bool, str]:
        """What the heartbeat of `component` reports; default `probe` (`ipamgc combined` beats each of its
        three components on its own and serves the three together on `/healthz`)."""
        return self.probe()

    def serving(self, server: MetricsServer | None) -> Background | None:
        """Called once the metrics server is up (None: not served, port 0 or not bound): register what the
        component serves beside the runner's, and return what should run beside the work (started
        after the heartbeat, stopped before the server closes), if anything."""
        return None

    def signals(self) -> Mapping[signal.Signals, Callable[[], None]]:
        """Signals the component handles beside SIGTERM and SIGINT (the watcher's SIGUSR1)."""
        return {}

    def run(self) -> int:
        """The component's work, until it ends or is stopped; returns the process's exit status."""
        raise NotImplementedError

    def stop(self) -> None:
        """Asked on SIGTERM or SIGINT (from the signal handler: only set a flag)."""


def run_process(
    command: str,
    opened: AbstractContextManager[Process],
    keys: Keys,
    port: int,
    host: str | None,
    collectors: tuple[Collector, ...] = (),
) -> NoReturn:
    """Run the process `opened` yields, with its signals, metrics server, health and heartbeat, and exit
    with the status its `run` returns (2, with one line naming `command`, on a configuration error).
    `port` 0: no metrics server; `host` None: `IPAMGC_METRICS_HOST`, else 0.0.0.0; `collectors` are
    served while the server runs (the API requests of the components that make any)."""
    try:
        code = _run(opened, keys, port, host, collectors)
    except ConfigError as exc:
        click.echo(f"ipamgc {command}: {exc}", err=True)
        sys.exit(EXIT_CONFIG)
    sys.exit(code)


def _run(
    opened: AbstractContextManager[Process],
    keys: Keys,
    port: int,
    host: str | None,
    collectors: tuple[Collector, ...],
) -> int:
    with opened as process:
        _install_signals(process)
        addr = resolve_metrics_host(host)
        server = serve_metrics(port, process.component, addr=addr, probe=process.probe, collectors=collectors)
        background = process.serving(server)
        beat = Heartbeat(process.redis, keys, process.component, process.beat_probe).start()
        if background is not None:
            background.start()
        settle_collector()
        try:
            return process.run()
        finally:
            beat.stop()
            if background is not None:
                background.stop()
            if server is not None:
                server.close()


def settle_collector() -> None:
    """Before a component's work: what exists now (the imports, the clients, the settings; the imports of
    `ipamgc combined` alone are ~50,000 objects the cyclic collector tracks) is moved out of the
    collector's reach for good (`gc.freeze`), so that no full collection of the data a cold start builds
    walks it again.  Measured over `ipamgc combined`'s cold start against a real kube-apiserver with
    10,000 real-size pods: the collector's CPU 0.175 → 0.11 s (docs/benchmarks.md).  The thresholds stay
    CPython's: young collections every 10,000 allocations instead of 700 took it to 0.06 s, but the
    combined process's peak at 150,000 pods rose from 194 to 240 MiB (one run each; where it went was not
    taken apart)."""
    gc.freeze()


def _install_signals(process: Process) -> None:
    handlers: dict[signal.Signals, Callable[[], None]] = {}
    if process.handles_stop_signals:
        handlers = dict.fromkeys(STOP_SIGNALS, process.stop)
    handlers.update(process.signals())
    for signum, act in handlers.items():
        signal.signal(signum, _handler(act))


def _handler(act: Callable[[], None]) -> Callable[[int, FrameType | None], None]:
    def handle(signum: int, frame: FrameType | None) -> None:
        act()

    return handle
