"""`ipamgc lead`: the leader (what the leader container runs; standby replicas wait on the Lease).

Exit status: 0 when stopped (SIGTERM/SIGINT), 3 when the leadership was lost (the supervisor restarts
the process, which comes back as a standby), 2 on bad configuration.  `ipamgc up` runs the same thing
in-process with `workers.leader.loop.run_leader(settings, stop)`.
"""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType

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
from ipamgc.metrics import (
    Heartbeat,
    metrics_port_option,
    resolve_metrics_host,
    resolve_metrics_port,
    serve_metrics,
)
from kubeio.requestmetrics import RequestCollector
from redisio.client import redis_client
from shared.calicogroup import CalicoGroup
from shared.config import parse_grace
from shared.errors import ConfigError
from workers.leader.loop import EXIT_CONFIG, run_leader
from workers.leader.metrics import LeaderMetrics
from workers.leader.settings import LeaderSettings


@click.command("lead", cls=Command, renamed={**COMMON_RENAMED, **LEASE_RENAMED})
@common_options
@kube_options
@click.option(
    "--dry-run",
    is_flag=True,
    default=False,
    envvar="IPAMGC_DRY_RUN",
    allow_from_autoenv=False,
    help="Decide and record in the audit stream, write nothing to Kubernetes. [env: IPAMGC_DRY_RUN]",
)
@lease_options("ipamgc-leader", "ipamgc-leader")
@click.option(
    "--rate-limit",
    type=click.FloatRange(min=0),
    default=50.0,
    show_default=True,
    envvar="IPAMGC_RATE_LIMIT",
    allow_from_autoenv=False,
    help="IP releases per second (token bucket); 0 = unlimited. [env: IPAMGC_RATE_LIMIT]",
)
@click.option(
    "--deleted-node-rate-limit",
    type=click.FloatRange(min=0),
    default=150.0,
    show_default=True,
    envvar="IPAMGC_DELETED_NODE_RATE_LIMIT",
    allow_from_autoenv=False,
    help="Releases per second of deleted nodes' IPs, a bucket of their own (autoscaler churn frees "
    "them in waves); 0 = unlimited. [env: IPAMGC_DELETED_NODE_RATE_LIMIT]",
)
@click.option(
    "--leak-grace-period",
    default=None,
    allow_from_autoenv=False,
    help="Go duration (15m, 90s), or `none`: the grace period of empty blocks, overriding the one the "
    "watcher mirrors from the cluster. [env: IPAMGC_LEAK_GRACE_PERIOD]",
)
@click.option(
    "--no-handle-gc",
    is_flag=True,
    default=False,
    envvar="IPAMGC_NO_HANDLE_GC",
    allow_from_autoenv=False,
    help="Switch off the handle collector (docs/handles.md): leaked and divergent IPAMHandles are left "
    "as they are; Calico's DISABLE_IPAM_HANDLE_GC. [env: IPAMGC_NO_HANDLE_GC]",
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
    settings = LeaderSettings(
        base=base,
        dry_run=dry_run,
        lease_namespace=lease_namespace,
        lease_name=lease_name,
        identity=identity,
        rate_limit=rate_limit,
        deleted_node_rate_limit=deleted_node_rate_limit,
        handle_gc=not no_handle_gc,
    )
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server = serve_metrics(
        port, "leader", addr=resolve_metrics_host(metrics_host), collectors=(RequestCollector(),)
    )
    metrics = LeaderMetrics(REGISTRY if server is not None else None)
    if server is not None:
        server.health.probe = metrics.health  # /healthz, /readyz: the main loop comes round
    client = redis_client(base.redis_url)
    beat = Heartbeat(client, base.keys, "leader", metrics.health).start()
    try:
        code = run_leader(settings, stop, metrics=metrics)
    except ConfigError as exc:
        click.echo(f"ipamgc lead: {exc}", err=True)
        sys.exit(EXIT_CONFIG)
    finally:
        beat.stop()
        client.close()
        if server is not None:
            server.close()
    sys.exit(code)


if __name__ == "__main__":
    lead()
