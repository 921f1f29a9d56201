"""`ipamgc watch`: the watcher (what the watcher container runs; standby replicas wait on the Lease)."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import TypeVar

import click
from prometheus_client import REGISTRY

from ipamgc.commands import (
    common_options,
    configure_logging,
    kube_options,
    kubeconfig_path,
    lease_options,
    load_settings,
)
from ipamgc.commands.flags import COMMON_RENAMED, LEASE_RENAMED, Command
from ipamgc.malloc import pin_mmap_threshold
from ipamgc.metrics import (
    Heartbeat,
    metrics_port_option,
    resolve_metrics_host,
    resolve_metrics_port,
    serve_metrics,
)
from kubeio.requestmetrics import RequestCollector
from producer.metrics import WatcherMetrics, watcher_health
from producer.watcher import open_watcher
from shared.calicogroup import CalicoGroup
from shared.config import BACKSTOPS, parse_grace, parse_seconds
from shared.errors import ConfigError

EXIT_CONFIG = 2
T = TypeVar("T")


def _parse(value: str | None, parse: Callable[[str], T]) -> T | None:
    if value is None:
        return None
    try:
        return parse(value)
    except (ConfigError, ValueError) as exc:
        raise click.BadParameter(str(exc)) from exc


@click.command("watch", cls=Command, renamed={**COMMON_RENAMED, **LEASE_RENAMED})
@common_options
@kube_options
@click.option(
    "--leak-grace-period",
    default=None,
    allow_from_autoenv=False,
    help="Go duration (15m, 90s), or `none` for Calico's unset; overrides the cluster's "
    "KubeControllersConfiguration. [env: IPAMGC_LEAK_GRACE_PERIOD]",
)
@click.option(
    "--resync-period",
    default=None,
    allow_from_autoenv=False,
    help="The backstop's period (default: grace period / 2, else 5m). [env: IPAMGC_RESYNC_PERIOD]",
)
@click.option(
    "--backstop",
    type=click.Choice(BACKSTOPS),
    default=None,
    allow_from_autoenv=False,
    help="What each period runs: `sweep` (audit the mirror, re-validate what the watcher's memory cannot "
    "show valid) or `full` (re-validate every allocation). Default sweep. [env: IPAMGC_BACKSTOP]",
)
@click.option(
    "--kick-interval",
    default=None,
    allow_from_autoenv=False,
    help="The longest between two kicks (30s); one runs when a grace ends. [env: IPAMGC_KICK_INTERVAL]",
)
@click.option(
    "--election/--no-election",
    default=None,
    allow_from_autoenv=False,
    help="Elect one active watcher with a Lease (default: on). [env: IPAMGC_ELECTION]",
)
@lease_options(None, "ipamgc-watcher")
@metrics_port_option
def watch(
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
    election: bool | None,
    lease_namespace: str | None,
    lease_name: str | None,
    identity: str | None,
    metrics_port: int | None,
    metrics_host: str | None,
) -> None:
    """List and watch the cluster and publish the allocations each event may have changed."""
    port = resolve_metrics_port(metrics_port)
    settings = load_settings(
        redis_url=redis_url,
        key_prefix=prefix,
        shards=shards_count,
        kubeconfig=kubeconfig_path(kubeconfig),
        kube_context=kube_context,
        calico_api_group=calico_api_group,
        leak_grace_override=_parse(leak_grace_period, parse_grace),
        resync_period_seconds=_parse(resync_period, parse_seconds),
        backstop=backstop,
        kick_interval_seconds=_parse(kick_interval, parse_seconds),
        election=election,
        election_namespace=lease_namespace,
        election_name=lease_name,
        election_identity=identity,
    )
    configure_logging(log_level, log_format)
    pin_mmap_threshold()  # before the lists: their pages are the buffers it is for
    try:
        with open_watcher(settings) as watcher:

            def stop(signum: int, frame: FrameType | None) -> None:
                watcher.stop()

            def backstop_now(signum: int, frame: FrameType | None) -> None:
                watcher.request_resync()  # the periodic backstop, now (then its period restarts)

            signal.signal(signal.SIGTERM, stop)
            signal.signal(signal.SIGINT, stop)
            signal.signal(signal.SIGUSR1, backstop_now)

            def probe() -> tuple[bool, str]:
                return watcher_health(watcher)

            server = serve_metrics(
                port,
                "watcher",
                addr=resolve_metrics_host(metrics_host),
                probe=probe,
                collectors=(RequestCollector(),),
            )
            metrics = WatcherMetrics(watcher, REGISTRY) if server is not None else None
            beat = Heartbeat(watcher.mirror.redis, settings.keys, "watcher", probe)
            beat.start()
            if metrics is not None:
                metrics.start()
            try:
                code = watcher.run()
            finally:
                beat.stop()
                if metrics is not None:
                    metrics.stop()
                if server is not None:
                    server.close()
    except ConfigError as exc:
        click.echo(f"ipamgc watch: {exc}", err=True)
        sys.exit(EXIT_CONFIG)
    sys.exit(code)


if __name__ == "__main__":
    watch()
