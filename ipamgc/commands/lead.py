"""`ipamgc lead`: the leader (what the leader container runs; standby replicas wait on the Lease).

Exit status: 0 when stopped (SIGTERM/SIGINT), 3 when the leadership was lost (the supervisor restarts
the process, which comes back as a standby), 2 on bad configuration.  `ipamgc up` runs the same thing
in-process with `workers.leader.loop.run_leader(settings, stop)`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import click
import redis
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
from ipamgc.metrics import MetricsServer, metrics_port_option, resolve_metrics_port
from ipamgc.runner import Process, run_process
from kubeio.requestmetrics import RequestCollector
from redisio.client import redis_client
from shared.calicogroup import CalicoGroup
from shared.config import Settings, parse_grace
from shared.errors import ConfigError
from workers.leader.loop import run_leader
from workers.leader.metrics import LeaderMetrics
from workers.leader.settings import LeaderSettings


def leader_options(func: F) -> F:
    """The leader's own flags (`ipamgc lead`, `ipamgc combined`): dry run, the two release rates, the
    handle collector's switch."""
    options = [
        click.option(
            "--dry-run",
            is_flag=True,
            default=False,
            envvar="IPAMGC_DRY_RUN",
            allow_from_autoenv=False,
            help="Decide and record in the audit stream, write nothing to Kubernetes. [env: IPAMGC_DRY_RUN]",
        ),
        click.option(
            "--rate-limit",
            type=click.FloatRange(min=0),
            default=50.0,
            show_default=True,
            envvar="IPAMGC_RATE_LIMIT",
            allow_from_autoenv=False,
            help="IP releases per second (token bucket); 0 = unlimited. [env: IPAMGC_RATE_LIMIT]",
        ),
        click.option(
            "--deleted-node-rate-limit",
            type=click.FloatRange(min=0),
            default=150.0,
            show_default=True,
            envvar="IPAMGC_DELETED_NODE_RATE_LIMIT",
            allow_from_autoenv=False,
            help="Releases per second of deleted nodes' IPs, a bucket of their own (autoscaler churn frees "
            "them in waves); 0 = unlimited. [env: IPAMGC_DELETED_NODE_RATE_LIMIT]",
        ),
        click.option(
            "--no-handle-gc",
            is_flag=True,
            default=False,
            envvar="IPAMGC_NO_HANDLE_GC",
            allow_from_autoenv=False,
            help="Switch off the handle collector (docs/handles.md): leaked and divergent IPAMHandles are "
            "left as they are; Calico's DISABLE_IPAM_HANDLE_GC. [env: IPAMGC_NO_HANDLE_GC]",
        ),
    ]
    return option_group(*options)(func)


def leader_settings(base: Settings, params: Mapping[str, Any], **more: Any) -> LeaderSettings:
    """The leader's settings of the `leader_options` and Lease flags in `params` (`ipamgc lead`'s, `ipamgc
    combined`'s parsed parameters) on `base`, with `more` on top."""
    values: dict[str, Any] = {
        "dry_run": params["dry_run"],
        "lease_namespace": params["lease_namespace"],
        "lease_name": params.get("lease_name", "ipamgc-leader"),
        "identity": params["identity"],
        "rate_limit": params["rate_limit"],
        "deleted_node_rate_limit": params["deleted_node_rate_limit"],
        "handle_gc": not params["no_handle_gc"],
    }
    return LeaderSettings(base=base, **{**values, **more})


@click.command("lead", cls=Command, renamed={**COMMON_RENAMED, **LEASE_RENAMED})
@common_options
@kube_options
@leader_options
@lease_options("ipamgc-leader", "ipamgc-leader")
@click.option(
    "--leak-grace-period",
    default=None,
    allow_from_autoenv=False,
    help="Go duration (15m, 90s), or `none`: the grace period of empty blocks, overriding the one the "
    "watcher mirrors from the cluster. [env: IPAMGC_LEAK_GRACE_PERIOD]",
)
@metrics_port_option
def lead(
    redis_url: str | None,
    prefix: str | None,
    shards_count: int | None,
    log_level: str,
    log_format: str,
    kubeconfig: str | None,
    kube_context: str | None,
    calico_api_group: CalicoGroup | None,
    dry_run: bool,
    lease_namespace: str | None,
    lease_name: str,
    identity: str | None,
    rate_limit: float,
    deleted_node_rate_limit: float,
    leak_grace_period: str | None,
    no_handle_gc: bool,
    metrics_port: int | None,
    metrics_host: str | None,
) -> None:
    """Release confirmed leaks, empty blocks and deleted nodes' affinities, and repair leaked IPAMHandles:
    the only writer."""
    port = resolve_metrics_port(metrics_port)
    configure_logging(log_level, log_format)
    try:
        grace = parse_grace(leak_grace_period) if leak_grace_period is not None else None
    except (ConfigError, ValueError) as exc:
        raise click.BadParameter(str(exc), param_hint="--leak-grace-period") from exc
    base = load_settings(
        redis_url=redis_url,
        key_prefix=prefix,
        shards=shards_count,
        kubeconfig=kubeconfig_path(kubeconfig),
        kube_context=kube_context,
        calico_api_group=calico_api_group,
        leak_grace_override=grace,
    )
    settings = leader_settings(base, click.get_current_context().params)
    collectors = (RequestCollector(),)
    run_process("lead", _opened(settings), base.keys, port, metrics_host, collectors)


class LeaderProcess(Process):
    """The leader as the runner runs it: stopped through an event its loop checks; its health is its
    metrics' (the main loop comes round), which exist once the runner knows whether it serves them."""

    component = "leader"

    def __init__(self, client: redis.Redis, settings: LeaderSettings) -> None:
        super().__init__(client)
        self.settings = settings
        self.stopping = threading.Event()
        self.metrics: LeaderMetrics | None = None  # made in `serving`

    def probe(self) -> tuple[bool, str]:
        return (True, "running") if self.metrics is None else self.metrics.health()

    def serving(self, server: MetricsServer | None) -> None:
        self.metrics = LeaderMetrics(REGISTRY if server is not None else None)

    def run(self) -> int:
        return run_leader(self.settings, self.stopping, metrics=self.metrics)

    def stop(self) -> None:
        self.stopping.set()


@contextlib.contextmanager
def _opened(settings: LeaderSettings) -> Iterator[LeaderProcess]:
    client = redis_client(settings.base.redis_url)  # the heartbeat's
    try:
        yield LeaderProcess(client, settings)
    finally:
        client.close()


if __name__ == "__main__":
    lead()
