"""`ipamgc combined`: the watcher, an RQ worker for every shard and the leader in one process.

Why: each component is a Python process that starts at ~40 MiB of interpreter and libraries (redis-py,
RQ, the metrics client) before it holds anything; four of them (a watcher, two workers, the leader) are
~168 MiB, more than Calico's whole collector at 10,000 pods.  A cluster whose events one process keeps up
with (the benchmark's: docs/benchmarks.md, "One process") can run the three as one: the same code, the
same Redis keys, the same two Leases (a second replica stands by for both), the same heartbeats and
`/metrics`.  What it gives up: the workers do not scale out, and the three share one interpreter's lock.

How: the watcher and the leader run in threads, the worker in the main thread (RQ handles SIGTERM and
SIGINT there: after the current job it stops, then the others are stopped and joined).  When the watcher
or the leader ends on its own (its Lease lost, a fatal error), the process stops the worker the same way
and exits with that component's status, so the orchestrator restarts the whole (each component's exit
statuses are `ipamgc watch`'s and `ipamgc lead`'s).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace

import click
import redis
from prometheus_client import REGISTRY

from ipamgc.commands import (
    common_options,
    configure_logging,
    kube_options,
    refuse_placeholder_password,
)
from ipamgc.commands.flags import COMMON_RENAMED, Command
from ipamgc.commands.lead import leader_options, leader_settings
from ipamgc.commands.watch import watcher_options, watcher_settings
from ipamgc.commands.work import worker_options
from ipamgc.malloc import pin_mmap_threshold
from ipamgc.metrics import Heartbeat, MetricsServer, metrics_port_option, resolve_metrics_port
from ipamgc.runner import Process, run_process
from kubeio.requestmetrics import RequestCollector
from producer.metrics import WatcherMetrics, watcher_health
from producer.watcher import Watcher, open_watcher
from redisio.client import redis_client
from shared.calicogroup import CalicoGroup
from workers.leader.loop import run_leader
from workers.leader.metrics import LeaderMetrics
from workers.leader.settings import LeaderSettings
from workers.shards.run import run_workers

log = logging.getLogger(__name__)

JOIN_SECONDS = 30.0  # how long a stopped component may take to end before the process exits anyway


@click.command("combined", cls=Command, renamed=COMMON_RENAMED)
@common_options
@kube_options
@watcher_options
@leader_options
@click.option(
    "--lease-namespace",
    "lease_namespace",
    default=None,
    allow_from_autoenv=False,
    help="Namespace of both Leases, the watcher's and the leader's (kube-system). "
    "[env: IPAMGC_ELECTION_NAMESPACE, POD_NAMESPACE]",
)
@click.option(
    "--lease-name",
    "lease_name",
    default=None,
    allow_from_autoenv=False,
    help="Name of the watcher's Lease (ipamgc-watcher). [env: IPAMGC_ELECTION_NAME]",
)
@click.option(
    "--leader-lease-name",
    default="ipamgc-leader",
    show_default=True,
    envvar="IPAMGC_LEADER_LEASE_NAME",
    allow_from_autoenv=False,
    help="Name of the leader's Lease. [env: IPAMGC_LEADER_LEASE_NAME]",
)
@click.option(
    "--identity",
    default=None,
    allow_from_autoenv=False,
    help="Holder identity in both Leases (default: hostname-pid-random). "
    "[env: IPAMGC_ELECTION_IDENTITY, POD_NAME]",
)
@click.option(
    "--worker-redis-url",
    default=None,
    envvar="IPAMGC_WORKER_REDIS_URL",
    allow_from_autoenv=False,
    help="The worker's Redis URL, to log in as its own user (default: --redis-url). "
    "[env: IPAMGC_WORKER_REDIS_URL]",
)
@click.option(
    "--leader-redis-url",
    default=None,
    envvar="IPAMGC_LEADER_REDIS_URL",
    allow_from_autoenv=False,
    help="The leader's Redis URL, to log in as its own user (default: --redis-url). "
    "[env: IPAMGC_LEADER_REDIS_URL]",
)
@worker_options
@metrics_port_option
def combined(
    redis_url: str | None,
    prefix: str | None,
    shards_count: int | None,
    log_level: str,
    log_format: str,
    kubeconfig: str | None,
    kube_context: str | None,
    calico_api_group: CalicoGroup | None,
    leak_grace_period: str | None,
    resync_period: str | None,
    backstop: str | None,
    kick_interval: str | None,
    dry_run: bool,
    rate_limit: float,
    deleted_node_rate_limit: float,
    no_handle_gc: bool,
    lease_namespace: str | None,
    lease_name: str | None,
    leader_lease_name: str,
    identity: str | None,
    worker_redis_url: str | None,
    leader_redis_url: str | None,
    batch_size: int | None,
    name: str | None,
    metrics_port: int | None,
    metrics_host: str | None,
) -> None:
    """The watcher, a worker for every shard and the leader, in this one process."""
    port = resolve_metrics_port(metrics_port)
    params = click.get_current_context().params
    base = watcher_settings(
        params,
        election=True,  # a second replica stands by: both Leases always
        election_namespace=lease_namespace,
        election_name=lease_name,
        election_identity=identity,
        batch_size=batch_size,
    )
    for url in (worker_redis_url, leader_redis_url):
        if url is not None:
            refuse_placeholder_password(url)
    urls = Urls(worker_redis_url or base.redis_url, leader_redis_url or base.redis_url)
    settings = leader_settings(base, params, lease_name=leader_lease_name)
    configure_logging(log_level, log_format)
    pin_mmap_threshold()  # the watcher's lists (ipamgc/malloc.py)
    opened = _opened(settings, urls, name)
    run_process("combined", opened, base.keys, port, metrics_host, (RequestCollector(),))


@dataclass(frozen=True, slots=True)
class Urls:
    """The worker's and the leader's Redis URLs: with Redis users (README, "Redis users") each component
    logs in as its own, as it does in a process of its own; the watcher's is `--redis-url`."""

    worker: str
    leader: str


class CombinedProcess(Process):
    """The three components as the runner runs one process: the runner's heartbeat is the watcher's,
    the worker's and the leader's are started here; `/healthz` is alive while all three are."""

    component = "watcher"
    handles_stop_signals = False  # RQ's worker, in the main thread, installs them

    def __init__(
        self, watcher: Watcher, settings: LeaderSettings, urls: Urls, clients: Clients, name: str | None
    ) -> None:
        super().__init__(watcher.mirror.redis)
        self.watcher, self.name, self.clients = watcher, name, clients
        # The leader and the worker with their own Redis URLs (the watcher's is its own already).
        self.settings = replace(settings, base=replace(settings.base, redis_url=urls.leader))
        self.worker_settings = replace(settings.base, redis_url=urls.worker)
        self.leader_stop = threading.Event()
        self.leader_metrics: LeaderMetrics | None = None
        self.status: dict[str, int] = {}
        self.worker_state = "starting"  # then "running", then "stopped"

    def _leader_health(self) -> tuple[bool, str]:
        return (True, "running") if self.leader_metrics is None else self.leader_metrics.health()

    def _worker_health(self) -> tuple[bool, str]:
        return self.worker_state != "stopped", self.worker_state

    def beat_probe(self) -> tuple[bool, str]:
        return watcher_health(self.watcher)  # the runner's heartbeat is the watcher's

    def probe(self) -> tuple[bool, str]:
        parts = {
            "watcher": watcher_health(self.watcher),
            "worker": self._worker_health(),
            "leader": self._leader_health(),
        }
        alive = all(ok for ok, _ in parts.values())
        return alive, " ".join(f"{c}:{state}" for c, (_, state) in parts.items())

    def serving(self, server: MetricsServer | None) -> WatcherMetrics | None:
        self.leader_metrics = LeaderMetrics(REGISTRY if server is not None else None)
        return WatcherMetrics(self.watcher, REGISTRY) if server is not None else None

    def signals(self) -> Mapping[signal.Signals, Callable[[], None]]:
        return {signal.SIGUSR1: self.watcher.request_resync}  # as `ipamgc watch`

    def _component(self, name: str, run: Callable[[], int]) -> threading.Thread:
        def body() -> None:
            try:
                code = run()
            except Exception:
                log.exception("%s ended with an error", name)
                code = 1
            self.status[name] = code
            if self.worker_state == "running":
                # Ended on its own: stop the worker as SIGTERM does (after its current job).
                log.warning("%s ended (status %d): stopping this process", name, code)
                os.kill(os.getpid(), signal.SIGTERM)

        thread = threading.Thread(target=body, name=f"ipamgc-{name}", daemon=True)
        thread.start()
        return thread

    def run(self) -> int:
        metrics = self.leader_metrics
        keys = self.settings.base.keys
        beats = [
            Heartbeat(self.clients.leader, keys, "leader", self._leader_health).start(),
            Heartbeat(self.clients.worker, keys, "worker", self._worker_health).start(),
        ]
        self.worker_state = "running"
        # Until RQ installs its handlers (the worker's start), a SIGTERM (the kubelet's, or a component
        # ending on its own) is kept here and handed over to them, instead of killing the process (143).
        pending = threading.Event()
        signal.signal(signal.SIGTERM, lambda _signum, _frame: pending.set())
        threads = [
            self._component("watcher", self.watcher.run),
            self._component("leader", lambda: run_leader(self.settings, self.leader_stop, metrics=metrics)),
        ]
        try:
            run_workers(
                self.worker_settings,
                None,
                False,
                name=self.name,
                rq_log_level=_rq_level(),
                stop_pending=pending,
            )
        finally:
            self.worker_state = "stopped"
            self.watcher.stop()
            self.leader_stop.set()
            for thread in threads:
                thread.join(JOIN_SECONDS)
            for beat in beats:
                beat.stop()
        failed = [code for code in self.status.values() if code != 0]
        return failed[0] if failed else 0


def _rq_level() -> str:
    """RQ's per-job lines (a few a job, a job every few seconds a shard) at WARNING unless debugging: in one
    process they would bury the watcher's and the leader's lines, which `ipamgc work`'s log keeps apart."""
    root = logging.getLogger().getEffectiveLevel()
    return logging.getLevelName(root if root <= logging.DEBUG else max(root, logging.WARNING))


@contextlib.contextmanager
def _opened(settings: LeaderSettings, urls: Urls, name: str | None) -> Iterator[CombinedProcess]:
    clients = Clients(redis_client(urls.worker), redis_client(urls.leader))  # their heartbeats'
    try:
        with open_watcher(settings.base) as watcher:
            yield CombinedProcess(watcher, settings, urls, clients, name)
    finally:
        clients.worker.close()
        clients.leader.close()


@dataclass(frozen=True, slots=True)
class Clients:
    worker: redis.Redis
    leader: redis.Redis


if __name__ == "__main__":
    combined()
