"""What every component process runs beside its work: the `/metrics` endpoint and the heartbeat.

The components' own modules say what they count (`producer/metrics.py`, `workers/shards/metrics.py`,
`workers/leader/metrics.py`, `shared/metrics_names.py`); this is the process plumbing the entry points
(`ipamgc watch|work|lead`) share, started and stopped for each of them by `ipamgc/runner.py`:
- `--metrics-port` (`IPAMGC_METRICS_PORT`, default 9094 as Calico's kube-controllers, 0 disables):
  prometheus-client's WSGI app on a daemon thread, serving the default registry (which carries the
  process, platform and GC collectors) plus `ipamgc_build_info{component, version}`.  The thread sleeps
  until a request comes (`start_http_server`'s loop wakes twice a second to look for a shutdown:
  0.25 of the 0.37 ms/s an idle worker serving metrics spent); `close` wakes it with a connection of
  its own.  A port already taken (several components on one host, as `ipamgc up` runs them) is logged
  and skipped: metrics are never a reason for a component not to run.  The same port answers the
  Kubernetes probes, `/healthz`, `/livez` and `/readyz`, from memory (`ipamgc/healthz.py`).
- `Heartbeat`: `P:health:<component>:<instance>` (`shared/keys.py`) rewritten every 5 s with a 30 s TTL
  while the component's probe says its main loop is coming round; `ipamgc health` reads it for the
  Kubernetes and compose probes.  The instance is `IPAMGC_INSTANCE`, else `POD_NAME`, else the hostname:
  the process and its probe, run in the same container, agree on it without talking.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import Any, TypeVar
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import click
import redis
from prometheus_client import REGISTRY, CollectorRegistry, make_wsgi_app
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ipamgc import __version__
from ipamgc.healthz import HealthApp
from shared import metrics_names as m
from shared.keys import Keys

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])
Probe = Callable[[], tuple[bool, str]]  # → (alive, state)
ENV_PORT = "IPAMGC_METRICS_PORT"
ENV_HOST = "IPAMGC_METRICS_HOST"
# A component's default: every interface, where Prometheus scrapes it in a pod or a container; `ipamgc up`
# passes 127.0.0.1 (local runs stay local).
DEFAULT_METRICS_HOST = "0.0.0.0"


def metrics_port_option(func: F) -> F:
    """`--metrics-port` and `--metrics-host` for a component command (None: `IPAMGC_METRICS_PORT`, else
    9094; `IPAMGC_METRICS_HOST`, else 0.0.0.0)."""
    func = click.option(
        "--metrics-host",
        default=None,
        metavar="ADDRESS",
        allow_from_autoenv=False,
        help=f"Listen address of /metrics ({DEFAULT_METRICS_HOST}). [env: {ENV_HOST}]",
    )(func)
    return click.option(
        "--metrics-port",
        type=click.IntRange(0, 65535),
        default=None,
        allow_from_autoenv=False,
        help=f"Port of /metrics ({m.DEFAULT_METRICS_PORT}, Calico's); 0 disables. [env: {ENV_PORT}]",
    )(func)


def resolve_metrics_host(flag: str | None, environ: Mapping[str, str] | None = None) -> str:
    """The address to listen on: the flag, else the environment, else 0.0.0.0."""
    return flag or (os.environ if environ is None else environ).get(ENV_HOST) or DEFAULT_METRICS_HOST


def resolve_metrics_port(flag: int | None, environ: Mapping[str, str] | None = None) -> int:
    """The port to serve on: the flag, else the environment, else 9094."""
    if flag is not None:
        return flag
    text = (os.environ if environ is None else environ).get(ENV_PORT, "")
    if not text:
        return m.DEFAULT_METRICS_PORT
    try:
        port = int(text)
    except ValueError:
        raise click.UsageError(f"{ENV_PORT}={text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise click.UsageError(f"{ENV_PORT}={text!r} is not a port number")
    return port


def instance_name(environ: Mapping[str, str] | None = None) -> str:
    """This process's heartbeat instance: `IPAMGC_INSTANCE`, else `POD_NAME`, else the hostname."""
    env = os.environ if environ is None else environ
    return env.get("IPAMGC_INSTANCE") or env.get("POD_NAME") or socket.gethostname()


class _BuildInfo(Collector):
    def __init__(self, component: str) -> None:
        self.component = component

    def collect(self) -> Iterator[Metric]:
        fam = GaugeMetricFamily(
            m.BUILD_INFO, "ipamgc version and component.", labels=["component", "version"]
        )
        fam.add_metric([self.component, __version__], 1)
        yield fam


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a request's thread never holds up the process's exit


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@dataclass
class MetricsServer:
    port: int
    registry: CollectorRegistry
    _server: WSGIServer
    _thread: threading.Thread
    _info: _BuildInfo
    _closing: threading.Event
    health: HealthApp
    _extra: tuple[Collector, ...] = ()

    def close(self) -> None:
        self.health.closing = True  # /readyz fails from here on
        self._closing.set()
        host, port = self._server.server_address[:2]
        wake = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(str(host), str(host))
        with contextlib.suppress(OSError), socket.create_connection((wake, int(port)), timeout=1):
            pass  # the loop's `handle_request` returns, sees `_closing`, and ends
        self._thread.join(timeout=5)
        self._server.server_close()
        for collector in (self._info, *self._extra):
            with contextlib.suppress(KeyError):
                self.registry.unregister(collector)


def _serve(server: WSGIServer, closing: threading.Event) -> None:
    while not closing.is_set():
        server.handle_request()  # sleeps in select until a connection (`timeout` None)


def serve_metrics(
    port: int,
    component: str,
    registry: CollectorRegistry = REGISTRY,
    addr: str = "0.0.0.0",
    probe: Probe | None = None,
    collectors: tuple[Collector, ...] = (),
) -> MetricsServer | None:
    """Serve `registry` on `addr:port/metrics`, and `probe` on `/healthz`, `/livez`, `/readyz`, from a
    daemon thread; None when disabled or not bound.  `probe` None: always alive (`.health.probe` may be
    set later).  `collectors` are registered while it serves (the API requests: `kubeio.requestmetrics`)."""
    if port == 0:
        return None
    info = _BuildInfo(component)
    registry.register(info)
    try:
        family = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]

        class _Family(_Server):
            address_family = family

        health = HealthApp(make_wsgi_app(registry), component, probe)
        server = make_server(addr, port, health, _Family, handler_class=_Quiet)
    except OSError as exc:
        registry.unregister(info)
        log.warning("metrics not served: cannot listen on %s:%s: %s", addr, port, exc)
        return None
    server.timeout = None
    for collector in collectors:
        registry.register(collector)
    closing = threading.Event()
    thread = threading.Thread(target=_serve, args=(server, closing), name="ipamgc-metrics", daemon=True)
    thread.start()
    log.info("metrics on http://%s:%s/metrics", addr, port, extra={"component": component})
    return MetricsServer(port, registry, server, thread, info, closing, health, collectors)


class Heartbeat:
    """Rewrites this process's health key while `probe()` says it is alive (see the module docstring).

    A probe that reports a stalled main loop stops the beats: the key expires and the liveness probe
    fails, so the orchestrator restarts the process.  A beat that cannot reach Redis is skipped.
    """

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        component: str,
        probe: Probe,
        *,
        instance: str | None = None,
        interval: float = m.HEARTBEAT_INTERVAL_SECONDS,
        ttl: float = m.HEARTBEAT_TTL_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if component not in m.COMPONENTS:
            raise ValueError(f"unknown component {component!r}")
        self.client = client
        self.key = keys.health(component, instance or instance_name())
        self.component = component
        self.probe = probe
        self.interval = interval
        self.ttl = ttl
        self.clock = clock
        self.started = clock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stalled = False

    def beat(self) -> bool:
        """Write the key once if the probe says alive; returns whether it was written."""
        alive, state = self.probe()
        if not alive:
            if not self._stalled:
                log.error("main loop stalled: heartbeat stopped", extra={"component": self.component})
            self._stalled = True
            return False
        self._stalled = False
        record = {"pid": os.getpid(), "state": state, "at": self.clock(), "started": self.started}
        record["version"] = __version__
        self.client.set(self.key, json.dumps(record), px=int(self.ttl * 1000))
        return True

    def start(self) -> Heartbeat:
        self._thread = threading.Thread(target=self._run, name="ipamgc-heartbeat", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            try:
                self.beat()
            except redis.RedisError as exc:
                log.warning("heartbeat not written: %s", exc, extra={"component": self.component})
            if self._stop.wait(self.interval):
                return

    def stop(self) -> None:
        """Stop beating and delete the key: a process that stopped cleanly is not left looking alive."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with contextlib.suppress(redis.RedisError):
            self.client.delete(self.key)
