"""What one phase cost, and how long leaks waited: the arithmetic of the benchmark, apart from its plumbing.

Why a module of its own: the figures the project's claims rest on (CPU per pod event, commands per
event, leak → release latency minus the grace period) are computed here, from plain readings taken at
the phase boundaries (`Reading`) and from the simulator's ground truth, so that they can be read and
checked in one place.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lab.bench.probe import Commands
from lab.bench.procs import MIB, CpuSample, Fleet, Usage, cpu_delta, grouped, grouped_max
from lab.cluster.churn import Churn, ChurnStats
from lab.cluster.cluster import SimCluster
from lab.cluster.nodechurn import held_ips
from lab.cluster.truth import GroundTruth
from lab.cluster.truth import Usage as Life
from shared.gcrecords import Decision

TOP_COMMANDS = 10


@dataclass(frozen=True, slots=True)
class Reading:
    """Everything read at one phase boundary."""

    monotonic: float
    wall: float  # epoch seconds (the simulator's ground truth and the decisions use wall time)
    usage: Usage
    commands: Commands
    # The watcher's CPU seconds per thread (`procs.thread_cpu_seconds`); {} while it is not running.
    watcher_threads: Mapping[str, float] = field(default_factory=dict)


def phase_cost(start: Reading, end: Reading, fleet: Fleet, events: int) -> dict[str, Any]:
    """Wall time, CPU per role, Redis commands and peak RSS between two readings; per event if `events`."""
    deltas = {n: cpu_delta(start.usage.cpu.get(n, CpuSample(0.0)), end.usage.cpu[n]) for n in end.usage.cpu}
    cpu = {role: round(v, 4) for role, v in grouped({n: d for n, (d, _) in deltas.items()}, fleet).items()}
    total_cpu = round(sum(cpu.values()), 4)
    commands = end.commands.minus(start.commands)
    total_commands = sum(commands.values())
    wall = end.monotonic - start.monotonic
    peak = grouped_max(end.usage.peak_rss, fleet)
    out: dict[str, Any] = {
        "wall_seconds": round(wall, 3),
        "cpu_seconds": {**cpu, "total": total_cpu},
        "cpu_utilisation": round(total_cpu / wall, 3) if wall > 0 else None,
        "redis_commands": total_commands,
        "top_commands": dict(sorted(commands.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_COMMANDS]),
        "peak_rss_mib": {role: round(b / MIB, 1) for role, b in peak.items()},
        "events": events,
        # Processes whose CPU is exact (threads' nanoseconds) or in 10 ms ticks (a thread ended).
        "cpu_exact_processes": sum(1 for _, exact in deltas.values() if exact),
        "cpu_ticks_processes": sum(1 for _, exact in deltas.values() if not exact),
    }
    threads = {
        name: end.watcher_threads[name] - start.watcher_threads.get(name, 0.0) for name in end.watcher_threads
    }
    threads = dict(sorted(((n, v) for n, v in threads.items() if v >= 0.0005), key=lambda kv: -kv[1]))
    if threads:
        # Per thread of the watcher (schedstat, exact), by thread name.
        out["watcher_threads_cpu_seconds"] = {n: round(v, 4) for n, v in threads.items()}
    if events:
        if threads:
            out["watcher_threads_cpu_per_event_us"] = {
                n: round(1e6 * v / events, 1) for n, v in threads.items()
            }
        out["cpu_per_event_us"] = {role: round(1e6 * v / events, 1) for role, v in cpu.items()}
        out["cpu_per_event_us"]["total"] = round(1e6 * total_cpu / events, 1)
        out["redis_commands_per_event"] = round(total_commands / events, 2)
    return out


def api_requests(records: Iterable[Any], start: float, end: float) -> dict[str, Any]:
    """The API requests served between two wall-clock instants (the simulated API server's request log:
    `RequestRecord`s), in total and by verb and resource, e.g. `list pods`; watches count once, when
    they were answered."""
    by: dict[str, int] = {}
    total = 0
    for r in records:
        if start <= r.timestamp <= end and r.verb not in ("discovery", "health"):
            total += 1
            key = f"{r.verb} {r.resource}" + (f"/{r.subresource}" if r.subresource else "")
            by[key] = by.get(key, 0) + 1
    return {"total": total, "by_verb": dict(sorted(by.items(), key=lambda kv: (-kv[1], kv[0])))}


def net_of_idle(phase: Mapping[str, Any], idle: Mapping[str, Any]) -> dict[str, Any]:
    """A phase's CPU and commands per event with the idle rate × the phase's wall time taken off: what the
    events themselves cost, apart from what the system costs per second whatever happens."""
    wall, events = phase["wall_seconds"], phase["events"]
    rates = idle["cpu_per_second"]
    cpu = {role: max(0.0, v - rates.get(role, 0.0) * wall) for role, v in phase["cpu_seconds"].items()}
    commands = max(0.0, phase["redis_commands"] - idle["redis_commands_per_second"] * wall)
    return {
        "cpu_per_event_us": {role: round(1e6 * v / events, 1) for role, v in cpu.items()},
        "redis_commands_per_event": round(commands / events, 2),
    }


def percentiles(values: Sequence[float]) -> dict[str, Any]:
    """Count, p50, p99 and max (nearest rank), in seconds rounded to milliseconds; None when empty."""
    if not values:
        return {"count": 0, "p50": None, "p99": None, "max": None}
    ordered = sorted(values)

    def rank(p: float) -> float:
        return ordered[max(0, math.ceil(p * len(ordered)) - 1)]

    return {
        "count": len(ordered),
        "p50": round(rank(0.50), 3),
        "p99": round(rank(0.99), 3),
        "max": round(ordered[-1], 3),
    }


def lives_leaked_between(truth: GroundTruth, start: float, end: float) -> list[Life]:
    """Every IP lifetime whose use stopped (without CNI DEL) in [start, end) (wall clock)."""
    with truth._lock:
        return [
            life
            for lives in truth.usages.values()
            for life in lives
            if life.in_use_until is not None and start <= life.in_use_until < end and life.freed_by != "cni"
        ]


def release_latencies(lives: Iterable[Life], grace: float) -> tuple[list[float], int]:
    """Leak → release (by ipamgc) minus `grace`, per released lifetime; and how many are unreleased."""
    latencies: list[float] = []
    unreleased = 0
    for life in lives:
        if life.freed_at is None:
            unreleased += 1
        elif life.freed_by == "external" and life.in_use_until is not None:
            latencies.append(life.freed_at - life.in_use_until - grace)
    return latencies, unreleased


def decision_latencies(
    lives: Iterable[Life], decisions: Iterable[Decision], grace: float
) -> tuple[list[float], int]:
    """Leak → first decision on the `decisions` stream minus `grace`; and how many leaks have none."""
    first: dict[tuple[str, str], float] = {}
    for d in decisions:
        key = (d.handle, d.ip)
        first[key] = min(first.get(key, math.inf), d.decided_at)
    latencies: list[float] = []
    undecided = 0
    for life in lives:
        at = first.get((life.handle, life.ip))
        if at is None or life.in_use_until is None or at < life.in_use_until:
            undecided += 1
            continue
        latencies.append(at - life.in_use_until - grace)
    return latencies, undecided


def node_cleanup(
    deleted_at: Mapping[str, float], ips: Mapping[str, Sequence[Life]], decisions: Iterable[Decision]
) -> dict[str, dict[str, Any]]:
    """Per lost node: seconds from its deletion to its last IP released, and to its last IP decided."""
    decided: dict[tuple[str, str], float] = {}
    for d in decisions:
        decided[(d.handle, d.ip)] = min(decided.get((d.handle, d.ip), math.inf), d.decided_at)
    out: dict[str, dict[str, Any]] = {}
    for node, at in deleted_at.items():
        lives = ips.get(node, ())
        freed = [life.freed_at for life in lives if life.freed_at is not None]
        when = [decided.get((life.handle, life.ip)) for life in lives]
        out[node] = {
            "ips": len(lives),
            "released": len(freed),
            "released_p50_seconds": percentiles([t - at for t in freed])["p50"],
            "decided_p50_seconds": percentiles([w - at for w in when if w is not None])["p50"],
            "all_released_seconds": round(max(freed) - at, 3) if lives and len(freed) == len(lives) else None,
            "all_decided_seconds": (
                round(max(w for w in when if w is not None) - at, 3)
                if lives and all(w is not None for w in when)
                else None
            ),
        }
    return out


# -- the workload every mode gets alike (ipamgc's modes: `run.ModeRun`; Calico's: `calico.CalicoRun`) --


def create_sentinel(sim: SimCluster, tag: str) -> tuple[str, str, list[str]]:
    """The pod that marks the end of a phase, `sentinel-<tag>` (`-2`, `-3`, … when a sweep's earlier rate
    made one of that name) on the first node: (name, node, its IPs).  Every mode creates it at the same
    point, so that the simulator's random stream, and every later event, is the same in all."""
    node = sorted(sim.node_names)[0]
    name, n = f"sentinel-{tag}", 1
    while ("bench", name) in sim.pod_handles:
        n += 1
        name = f"sentinel-{tag}-{n}"
    return name, node, sim.create_pod("bench", name, node)


def drive_churn(sim: SimCluster, rate: float, seconds: float, leak_rate: float, seed: int) -> ChurnStats:
    """Exactly `rate × seconds` events, paced at `rate`: every mode gets the same seeded sequence of events
    even if one of them slows the simulator down."""
    churn = Churn(sim, rate, leak_rate, seed=seed)
    start = time.monotonic()
    for i in range(round(rate * seconds)):
        churn.step()
        delay = start + (i + 1) / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    return churn.stats


def prepare_node_loss(sim: SimCluster, count: int, pods: int) -> list[str]:
    """The nodes to lose (drawn from the simulator's seeded stream), each topped up to `pods` pods."""
    victims = sorted(sim.rng.sample(sorted(sim.node_names), count))
    for node in victims:
        have = sum(1 for n in sim.pod_nodes.values() if n == node)
        for i in range(max(0, pods - have)):
            sim.create_pod("bench", f"{node}-extra-{i}", node)
    return victims


def node_ips(sim: SimCluster, nodes: list[str]) -> dict[str, list[Life]]:
    """The live IP lifetimes of each node (its pods' and its tunnel's), before it is deleted."""
    return held_ips(sim, nodes)
