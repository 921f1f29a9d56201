"""`ipamgc demo`: the README's first command — the whole system on a simulated cluster, with a summary."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from rich.console import Console

from ipamgc.commands.flags import Command
from lab.cluster.podshape import POD_SIZE_HELP, POD_SIZES, PodSize
from lab.demo import DemoFailed, DemoOptions, render_summary, run_demo


@click.command("demo", cls=Command, renamed={"--json": ("--output", "json")})
@click.option("--nodes", default=200, show_default=True, help="Simulated nodes.")
@click.option("--pods-per-node", default=20, show_default=True, help="Running pods per node.")
@click.option("--churn", default=20.0, show_default=True, help="Pod events per second.")
@click.option("--leak-rate", default=0.1, show_default=True, help="Fraction of pod deletions that leak.")
@click.option("--workers", default=2, show_default=True, type=click.IntRange(min=1), help="Worker processes.")
@click.option("--leak-grace-period", "grace", default="5s", show_default=True, help="Go duration.")
@click.option("--duration", default=60.0, show_default=True, help="Seconds of churn (then leaks settle).")
@click.option("--seed", default=0, show_default=True)
@click.option(
    "--pod-size", type=click.Choice(POD_SIZES), default="small", show_default=True, help=POD_SIZE_HELP
)
@click.option("--log-dir", type=click.Path(path_type=Path), default=None, help="Default: a temporary dir.")
@click.option("--output", "-o", type=click.Choice(["table", "json"]), default="table", show_default=True)
def demo(
    nodes: int,
    pods_per_node: int,
    churn: float,
    leak_rate: float,
    workers: int,
    grace: str,
    duration: float,
    seed: int,
    pod_size: PodSize,
    log_dir: Path | None,
    output: str,
) -> None:
    """Run ipamgc on a simulated cluster with churn and leaks; exit 1 if an IP in use was released."""
    as_json = output == "json"
    console = Console(stderr=as_json)
    opts = DemoOptions(
        nodes, pods_per_node, churn, leak_rate, workers, grace, duration, seed, log_dir, pod_size=pod_size
    )
    try:
        result = run_demo(opts, console)
    except KeyboardInterrupt:
        console.print("ipamgc demo: interrupted")
        sys.exit(130)
    except DemoFailed as exc:
        click.echo(f"ipamgc demo: error: {exc}; stopped", err=True)
        sys.exit(2)
    except RuntimeError as exc:  # its Redis did not start
        click.echo(f"ipamgc demo: error: {exc}", err=True)
        sys.exit(2)
    if as_json:
        click.echo(json.dumps(result.__dict__, indent=2))
    else:
        render_summary(result, console)
    sys.exit(0 if result.ok() else 1)
