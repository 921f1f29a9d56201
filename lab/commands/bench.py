"""`ipamgc bench`: the benchmark of design.md, ipamgc's incremental mode against its two baselines,
Calico 3.30–3.33's per-node dirty tracking and Calico 3.26's full scan, in the same run.

Prints a short table (and progress on stderr); `--output-file FILE` writes the full JSON report.  Exit status
0 when the run completed (whether or not targets were met: the report says), 1 when a mode failed.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

import click
import orjson

from ipamgc.commands.flags import Command
from lab.bench import SOURCE_ROOT, BenchConfig, run_bench
from lab.bench.report import table
from lab.cluster.nodechurn import PRESETS as NODE_CHURN_PRESETS
from lab.cluster.podshape import POD_SIZES
from lab.commands import bench_args


@click.command("bench", cls=Command, renamed=bench_args.RENAMED)
@click.option("--nodes", default=200, show_default=True, type=click.IntRange(min=2), help="Nodes.")
@click.option("--pods-per-node", default=50, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--churn",
    "churn_rate",
    default="50",
    show_default=True,
    callback=bench_args.rates,
    metavar="RATE[,RATE…]",
    help="Pod events per second during the churn phase; several (e.g. 1,5,20,50): one churn phase per "
    "rate for every mode, CPU a second and per event at each, and where ipamgc and Calico cross.",
)
@click.option(
    "--idle-seconds",
    default=20.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds without events after the cold start (the fixed cost per second; the components' "
    "periodic work falls unevenly in shorter phases).",
)
@click.option("--churn-seconds", default=20.0, show_default=True, type=click.FloatRange(min=0))
@click.option(
    "--leak-rate",
    default=0.05,
    show_default=True,
    type=click.FloatRange(0, 1),
    help="Fraction of pod deletions that skip CNI DEL (leaks).",
)
@click.option("--node-loss", default=2, show_default=True, type=click.IntRange(min=0), help="Nodes lost.")
@click.option(
    "--node-loss-pods",
    default=110,
    show_default=True,
    type=click.IntRange(min=0),
    help="Pods on each lost node (topped up before the phase).",
)
@click.option("--workers", default=2, show_default=True, type=click.IntRange(min=1), help="Worker processes.")
@click.option(
    "--shard-count",
    "shards",
    default=4,
    show_default=True,
    type=click.IntRange(min=1),
    help="Shards (ipamgc's default).",
)
@click.option(
    "--batch-wait",
    default="1s",
    show_default=True,
    callback=bench_args.seconds,
    help="The watcher's batch wait.",
)
@click.option(
    "--leak-grace-period",
    "grace",
    default="2s",
    show_default=True,
    callback=bench_args.seconds,
    help="Go duration.",
)
@click.option(
    "--kick-interval",
    default="30s",
    show_default=True,
    callback=bench_args.seconds,
    help="The watcher's kick interval: the longest between two kicks (one runs when a grace period ends).",
)
@click.option(
    "--resync-period",
    default="7m30s",
    show_default=True,
    callback=bench_args.seconds,
    help="The watcher's full-resync period (production: grace / 2 = 7m30s for Calico's 15m grace).",
)
@click.option(
    "--leader/--no-leader",
    default=None,
    help="Run the leader and measure leak → release (default: if `ipamgc lead` works here); "
    "without it, leak → decision.",
)
@click.option(
    "--rate-limit",
    "leader_rate_limit",
    default=50.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="The leader's IP releases per second (token bucket); 0 = unlimited.",
)
@click.option(
    "--mode",
    "modes",
    default="all",
    show_default=True,
    callback=bench_args.modes,
    metavar="MODE[,MODE…]",
    help="Modes to run, in this order: incremental (ipamgc), per-node (an emulation of Calico 3.30–3.33's "
    "per-node dirty tracking: IPAMGC_PER_NODE=1 for the watcher and workers), full-scan (an emulation of "
    "Calico 3.26: IPAMGC_FULL_SCAN=1 for the watcher), calico (Calico's own kube-controllers binary: "
    "--calico-kube-controllers), combined (incremental as `ipamgc combined`: watcher, worker and leader in "
    "one process); all = incremental,per-node,full-scan; both = incremental,full-scan.",
)
@click.option(
    "--full-scan-max-pods",
    default=20_000,
    show_default=True,
    type=click.IntRange(min=0),
    help="Skip full-scan above this many pods (it re-validates everything on every batch); "
    "per-node always runs.",
)
@click.option(
    "--calico-kube-controllers",
    "calico_binaries",
    envvar="IPAMGC_CALICO_KUBE_CONTROLLERS",
    show_envvar=True,
    callback=bench_args.calico_binaries,
    metavar="PATH|NAME=PATH,…",
    help="Calico's own kube-controllers binary (or several, named) for --mode calico, e.g. copied out of "
    "Calico's calico/kube-controllers image (/usr/bin/kube-controllers).",
)
@click.option(
    "--calico-leak-grace-period",
    "calico_grace",
    default="15m",
    show_default=True,
    callback=bench_args.seconds,
    help="--mode calico: the grace period of its cost run (its full scan runs every grace / 2, so CPU is "
    "measured where none falls inside the run); its leak latency is measured at --grace.",
)
@click.option(
    "--backstop-passes",
    default=0,
    show_default=True,
    type=click.IntRange(min=0),
    help="Measure this many periodic passes of each collector: ipamgc's watcher on SIGUSR1 after the idle "
    "phase, Calico's binary in a third run (--calico-backstop-leak-grace-period); the report's backstop "
    "and hourly (CPU a second at 0, 2 and 20 pod events/s with a pass every 7.5 minutes). 0: neither.",
)
@click.option(
    "--calico-backstop-leak-grace-period",
    "calico_backstop_grace",
    default="60s",
    show_default=True,
    callback=bench_args.seconds,
    help="--backstop-passes with --mode calico: the grace period of the binary's backstop run (its full "
    "scan every grace / 2, one measured window per scan).",
)
@click.option(
    "--pod-size",
    type=click.Choice(POD_SIZES),
    default="real",
    show_default=True,
    help="The simulated pods: real (~13.8 KB of JSON, a Deployment's pod with managedFields), small "
    "(~0.4 KB, the figures before 2026-12-04 evening) or large (~54 KB); docs/pod-sizes.md.",
)
@click.option(
    "--kube-apiserver",
    "kube_apiserver",
    envvar="IPAMGC_KUBE_APISERVER",
    show_envvar=True,
    type=click.Path(exists=True, file_okay=False),
    metavar="DIR",
    help="Run every mode against a real kube-apiserver + etcd on loopback (DIR holds bin/kube-apiserver "
    "and bin/etcd: what `bash .ci/realapi-build` prints) instead of the simulated API server.",
)
@click.option("--seed", default=0, show_default=True, type=int)
@click.option(
    "--timeout", default="600s", show_default=True, callback=bench_args.seconds, help="Longest single wait."
)
@click.option(
    "--output-file",
    "output",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="PATH",
    help="Write the full JSON report here.",
)
@click.option(
    "--compare",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A previous report (e.g. at 10k pods) to compare CPU per event against.",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress lines on stderr.")
@click.option(
    "--leaked-handles",
    default=0,
    show_default=True,
    type=click.IntRange(min=0),
    help="Instead of the modes: the handle collector's scenario (lab/bench/handles.py), this many leaked "
    "IPAMHandles on --nodes × --pods-per-node pods, cleaned at --rate-limit on a virtual clock.",
)
@click.option(
    "--node-churn",
    type=click.Choice(sorted(NODE_CHURN_PRESETS)),
    help='A node-churn phase (docs/benchmarks.md, "Node churn and conflicts"): nodes replaced as an '
    "autoscaler does, drained or terminated abruptly, in a pool small enough to run out; 7839 = #7839's "
    "100 of 250 nodes every 15 minutes, hard = half of 400 every 10 minutes, 80 % abrupt (both ×10 "
    "faster).  The preset sets --nodes and --pods-per-node, and the idle, churn and node-loss phases to 0, "
    "unless given.",
)
@click.option(
    "--node-churn-periods",
    default=2.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="--node-churn: how many of the preset's periods of replacements to run.",
)
@click.option(
    "--conflicts-seconds",
    default=0.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="A conflicts phase this long (at least grace + 10 s): leaks on 4 nodes whose CNI starts and "
    "removes 20 pods/s each, so the collector's releases race the CNI's writes to the same blocks "
    "(Calico's binary: in its short-grace run).  0: none.",
)
@click.option(
    "--profile",
    "profile_dir",
    type=click.Path(file_okay=False, path_type=Path),
    hidden=True,
    help="Sample each component with py-spy during the cold start, idle and churn phases (raw stacks in this "
    "directory; slows them).",
)
def bench(
    nodes: int,
    pods_per_node: int,
    churn_rate: tuple[float, ...],
    idle_seconds: float,
    churn_seconds: float,
    leak_rate: float,
    node_loss: int,
    node_loss_pods: int,
    workers: int,
    shards: int,
    batch_wait: float,
    grace: float,
    kick_interval: float,
    resync_period: float,
    leader: bool | None,
    leader_rate_limit: float,
    modes: tuple[str, ...],
    full_scan_max_pods: int,
    calico_binaries: tuple[tuple[str, str], ...],
    calico_grace: float,
    backstop_passes: int,
    calico_backstop_grace: float,
    pod_size: str,
    kube_apiserver: str | None,
    seed: int,
    timeout: float,
    output: Path | None,
    compare: Path | None,
    quiet: bool,
    leaked_handles: int,
    node_churn: str | None,
    node_churn_periods: float,
    conflicts_seconds: float,
    profile_dir: Path | None,
) -> None:
    """Measure ipamgc against its per-node and full-scan baselines on a simulated cluster.

    Each mode runs the same seeded workload against real processes (cold start, idle, churn, node loss);
    the report gives per-node ÷ incremental and full-scan ÷ incremental ratios and the targets (see
    docs/benchmarks.md).
    """
    if leaked_handles:
        _handle_bench(nodes * pods_per_node, leaked_handles, nodes, leader_rate_limit, seed, output, quiet)
        return
    from lab.bench.run import leader_usable  # noqa: PLC0415 - only when the command runs

    if leader is None:
        leader = leader_usable(cwd=SOURCE_ROOT)
    if node_churn is not None:  # the preset's cluster, and its phase alone, unless the command says
        plan = NODE_CHURN_PRESETS[node_churn]
        source = click.get_current_context().get_parameter_source

        def default(name: str) -> bool:
            return source(name) is click.core.ParameterSource.DEFAULT

        nodes = plan.nodes if default("nodes") else nodes
        pods_per_node = plan.pods_per_node if default("pods_per_node") else pods_per_node
        churn_seconds = 0.0 if default("churn_seconds") else churn_seconds
        idle_seconds = 0.0 if default("idle_seconds") else idle_seconds
        node_loss = 0 if default("node_loss") else node_loss
    try:
        cfg = BenchConfig(
            nodes=nodes,
            pods_per_node=pods_per_node,
            churn_rate=churn_rate[-1],
            churn_rates=churn_rate if len(churn_rate) > 1 else (),
            idle_seconds=idle_seconds,
            churn_seconds=churn_seconds,
            leak_rate=leak_rate,
            node_loss=node_loss,
            node_loss_pods=node_loss_pods,
            workers=workers,
            shards=shards,
            batch_wait=batch_wait,
            grace=grace,
            kick_interval=kick_interval,
            resync_period=resync_period,
            leader=leader,
            leader_rate_limit=leader_rate_limit,
            modes=modes,
            full_scan_max_pods=full_scan_max_pods,
            calico_binaries=calico_binaries,
            kube_apiserver=kube_apiserver,
            calico_grace=calico_grace,
            backstop_passes=backstop_passes,
            calico_backstop_grace=calico_backstop_grace,
            pod_size=pod_size,
            node_churn=node_churn,
            node_churn_periods=node_churn_periods,
            conflicts_seconds=conflicts_seconds,
            seed=seed,
            timeout=timeout,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    baseline: Any = orjson.loads(compare.read_bytes()) if compare is not None else None

    def progress(line: str) -> None:
        if not quiet:
            click.echo(line, err=True)

    command = "ipamgc bench " + shlex.join(sys.argv[1:] if sys.argv[1:2] != ["bench"] else sys.argv[2:])
    if profile_dir is not None:
        profile_dir.mkdir(parents=True, exist_ok=True)
    result = run_bench(cfg, command=command, progress=progress, compare=baseline, profile_dir=profile_dir)
    if output is not None:
        output.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2) + b"\n")
    click.echo(table(result))
    failed = [m for m in result["modes"].values() if isinstance(m, dict) and "error" in m]
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    bench()


def _handle_bench(
    pods: int, leaked: int, nodes: int, rate_limit: float, seed: int, output: Path | None, quiet: bool
) -> None:
    """`--leaked-handles N`: the handle collector's scenario, apart from the modes' flow."""
    from lab.bench.handles import run_handle_bench, table  # noqa: PLC0415 - only when asked

    def say(line: str) -> None:
        if not quiet:
            click.echo(line, err=True)

    report = run_handle_bench(pods, leaked, nodes=nodes, rate_limit=rate_limit, seed=seed, say=say)
    if output is not None:
        output.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
    click.echo(table(report))
