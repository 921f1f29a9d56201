"""`ipamgc watch`: the watcher (what the watcher container runs; standby replicas wait on the Lease)."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import click
from prometheus_client import REGISTRY

from ipamgc.commands import (
    F,
    common_options,
    configure_logging,
    kube_options,
    kubeconfig_path,
    lease_options,
    load_settings,
    option_group,
)
from ipamgc.commands.flags import COMMON_RENAMED, LEASE_RENAMED, Command
from ipamgc.malloc import pin_mmap_threshold
from ipamgc.metrics import MetricsServer, metrics_port_option, resolve_metrics_port
from ipamgc.runner import Process, run_process
from kubeio.requestmetrics import RequestCollector
from producer.metrics import WatcherMetrics, watcher_health
from producer.watcher import Watcher, open_watcher
from shared.calicogroup import CalicoGroup
from shared.config import BACKSTOPS, Settings, parse_grace, parse_seconds
from shared.errors import ConfigError

T = TypeVar("T")


def _parse(value: str | None, parse: Callable[[str], T], flag: str) -> T | None:
    if value is None:
        return None
    try:
        return parse(value)
    except (ConfigError, ValueError) as exc:
        raise click.BadParameter(str(exc), param_hint=flag) from exc


def watcher_settings(params: Mapping[str, Any], **more: Any) -> Settings:
    """The settings of the common, cluster and `watcher_options` flags in `params` (a command's parsed
    parameters: `ipamgc watch`'s, `ipamgc combined`'s), with `more` on top."""
    return load_settings(
        redis_url=params["redis_url"],
        key_prefix=params["prefix"],
        shards=params["shards_count"],
        kubeconfig=kubeconfig_path(params["kubeconfig"]),
        kube_context=params["kube_context"],
        calico_api_group=params["calico_api_group"],
        leak_grace_override=_parse(params["leak_grace_period"], parse_grace, "--leak-grace-period"),
        resync_period_seconds=_parse(params["resync_period"], parse_seconds, "--resync-period"),
        backstop=params["backstop"],
        kick_interval_seconds=_parse(params["kick_interval"], parse_seconds, "--kick-interval"),
        **more,
    )


def watcher_options(func: F) -> F:
    """The watcher's own flags (`ipamgc watch`, `ipamgc combined`): the grace override, the backstop's
    period and kind, the kick interval."""
    options = [
        click.option(
            "--leak-grace-period",
            default=None,
            allow_from_autoenv=False,
            help="Go duration (15m, 90s), or `none` for Calico's unset; overrides the cluster's "
            "KubeControllersConfiguration. [env: IPAMGC_LEAK_GRACE_PERIOD]",
        ),
        click.option(
            "--resync-period",
            default=None,
            allow_from_autoenv=False,
            help="The backstop's period (default: grace period / 2, else 5m). [env: IPAMGC_RESYNC_PERIOD]",
        ),
        click.option(
            "--backstop",
            type=click.Choice(BACKSTOPS),
            default=None,
            allow_from_autoenv=False,
            help="What each period runs: `sweep` (audit the mirror, re-validate what the watcher's memory "
            "cannot show valid) or `full` (re-validate every allocation). Default sweep. "
            "[env: IPAMGC_BACKSTOP]",
        ),
        click.option(
            "--kick-interval",
            default=None,
            allow_from_autoenv=False,
            help="The longest between two kicks (30s); one runs when a grace ends. "
            "[env: IPAMGC_KICK_INTERVAL]",
        ),
    ]
    return option_group(*options)(func)


@click.command("watch", cls=Command, renamed={**COMMON_RENAMED, **LEASE_RENAMED})
@common_options
@kube_options
@watcher_options
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
    settings = watcher_settings(
        click.get_current_context().params,
        election=election,
        election_namespace=lease_namespace,
        election_name=lease_name,
        election_identity=identity,
    )
    configure_logging(log_level, log_format)
    pin_mmap_threshold()  # before the lists: their pages are the buffers it is for
    collectors = (RequestCollector(),)
    run_process("watch", _opened(settings), settings.keys, port, metrics_host, collectors)


class WatcherProcess(Process):
    """The watcher as the runner runs it: SIGUSR1 runs the backstop now; `/metrics` gets its readings."""

    component = "watcher"

    def __init__(self, watcher: Watcher) -> None:
        super().__init__(watcher.mirror.redis)
        self.watcher = watcher

    def probe(self) -> tuple[bool, str]:
        return watcher_health(self.watcher)

    def serving(self, server: MetricsServer | None) -> WatcherMetrics | None:
        return WatcherMetrics(self.watcher, REGISTRY) if server is not None else None

    def signals(self) -> Mapping[signal.Signals, Callable[[], None]]:
        # The periodic backstop, now (then its period restarts).
        return {signal.SIGUSR1: self.watcher.request_resync}

    def run(self) -> int:
        return self.watcher.run()

    def stop(self) -> None:
        self.watcher.stop()


@contextlib.contextmanager
def _opened(settings: Settings) -> Iterator[WatcherProcess]:
    with open_watcher(settings) as watcher:
        yield WatcherProcess(watcher)


if __name__ == "__main__":
    watch()
