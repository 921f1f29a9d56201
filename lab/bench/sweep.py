"""The churn at several event rates in one run (`ipamgc bench --churn 1,5,20,50`), and where ipamgc and
Calico's binary cross.

Why a module: at the rates most clusters see (a few pod events a second), a collector's fixed costs (its
idle floor, what each small batch pays whatever its size) decide its bill, not its cost per event at 50/s.
One run measures every mode at every rate, so the comparison is a ratio taken within one run.

Each mode runs its churn phase once per rate, in the order given, each at least `MIN_EVENTS_PER_RATE`
events long; the phases are `phases.churn_by_rate[<rate>]` of the mode's result, each with the keys of a
single-rate `phases.churn`, which is the last rate's.  The report's `churn_sweep` holds, per rate and
mode, the CPU a second and per pod event (all processes, Redis included), and
`crossover_events_per_second`: the rate below which ipamgc costs more CPU a second than Calico's binary.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from lab.bench.config import BenchConfig

# A rate's phase lasts `churn_seconds`, or as long as this many events take at that rate when longer (1/s
# for 20 s would be 20 events: the cost of a batch is then read from too few).
MIN_EVENTS_PER_RATE = 40
INCREMENTAL = "incremental"


class Sweeping(Protocol):
    cfg: BenchConfig
    result: dict[str, Any]


def rate_label(rate: float) -> str:
    return f"{rate:g}"


def seconds_at(cfg: BenchConfig, rate: float) -> float:
    return max(cfg.churn_seconds, MIN_EVENTS_PER_RATE / rate)


def churn_each_rate(run: Sweeping, churn: Callable[[], None]) -> None:
    """Run `churn` (the mode's churn phase, reading `run.cfg`) once per rate of `cfg.churn_rates`, or once
    when there is one rate.  `phases.churn` ends as the last rate's phase."""
    cfg = run.cfg
    if len(cfg.churn_rates) < 2:
        churn()
        return
    phases = run.result["phases"]
    by_rate: dict[str, Any] = {}
    try:
        for rate in cfg.churn_rates:
            run.cfg = dataclasses.replace(cfg, churn_rate=rate, churn_seconds=seconds_at(cfg, rate))
            churn()
            by_rate[rate_label(rate)] = phases["churn"]
    finally:
        run.cfg = cfg
        phases["churn_by_rate"] = by_rate


def _per_second(phase: Mapping[str, Any]) -> float | None:
    wall = phase.get("wall_seconds")
    total = phase.get("cpu_seconds", {}).get("total")
    if not wall or total is None:
        return None
    return round(float(total) / float(wall) * 1000, 3)


def _point(phase: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "cpu_ms_per_second": _per_second(phase),
        "cpu_per_event_us": phase.get("cpu_per_event_us", {}).get("total"),
        "achieved_rate": phase.get("achieved_rate"),
        "events": phase.get("events"),
        "wall_seconds": phase.get("wall_seconds"),
    }


def crossover(points: Sequence[tuple[float, float, float]]) -> float | None:
    """The rate below which ipamgc costs more CPU a second than Calico, from (rate, ipamgc ms/s, Calico
    ms/s) points in increasing rate (the idle phase as rate 0): 0 when ipamgc never costs more; where the
    difference changes sign, interpolated linearly between the two rates; None when ipamgc costs more at
    every rate measured (the crossover is above them)."""
    diff = [(rate, ours - theirs) for rate, ours, theirs in points]
    if all(d <= 0 for _, d in diff):
        return 0.0
    if diff[-1][1] > 0:
        return None
    for (r0, d0), (r1, d1) in zip(diff[::-1][1:], diff[::-1], strict=True):
        if d0 > 0 >= d1:  # the highest rate where ipamgc still costs more, then one where it does not
            return round(r0 + (r1 - r0) * d0 / (d0 - d1), 2)
    return 0.0  # unreachable: some d > 0 and the last ≤ 0 make such a pair


def summary(modes: Mapping[str, Any], calicos: Sequence[str]) -> dict[str, Any] | None:
    """The report's `churn_sweep` (see the module docstring), or None when no mode swept."""
    swept = {
        m: r["phases"]["churn_by_rate"]
        for m, r in modes.items()
        if isinstance(r, Mapping) and r.get("phases", {}).get("churn_by_rate")
    }
    if not swept:
        return None
    rates = sorted({float(label) for phases in swept.values() for label in phases})
    by_rate = {
        rate_label(rate): {m: _point(p[rate_label(rate)]) for m, p in swept.items() if rate_label(rate) in p}
        for rate in rates
    }
    idle: dict[str, float | None] = {
        m: _per_second(modes[m]["phases"]["idle"]) for m in swept if modes[m]["phases"].get("idle")
    }
    out: dict[str, Any] = {"rates": rates, "idle_cpu_ms_per_second": idle, "by_rate": by_rate}
    crossings: dict[str, float | None] = {}
    for calico in calicos:
        points: list[tuple[float, float, float]] = []
        ours_idle, theirs_idle = idle.get(INCREMENTAL), idle.get(calico)
        if ours_idle is not None and theirs_idle is not None:
            points.append((0.0, ours_idle, theirs_idle))
        for rate in rates:
            row = by_rate[rate_label(rate)]
            ours = row.get(INCREMENTAL, {}).get("cpu_ms_per_second")
            theirs = row.get(calico, {}).get("cpu_ms_per_second")
            if ours is not None and theirs is not None:
                points.append((rate, ours, theirs))
        if len(points) >= 2:
            crossings[calico] = crossover(points)
    out["crossover_by_mode"] = crossings
    out["crossover_events_per_second"] = (
        crossings[calicos[0]] if calicos and calicos[0] in crossings else None
    )
    return out
