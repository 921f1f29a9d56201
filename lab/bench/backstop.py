"""The backstop phase (`ipamgc bench --backstop-passes N`): what ONE periodic pass of each collector costs,
and what each costs a second over an hour at the production default.

Why a module of its own: every other phase keeps both collectors' periodic passes out of its window
(ipamgc's watcher runs with `--resync-period 7m30s`, Calico's cost run at a 15-minute grace), so no other
figure holds them; yet in production each collector runs one every leak grace period / 2, 7.5 minutes at
the default 15, whatever the event rate.  The two sides are measured differently, because only one of
them can be asked for a pass:
- **ipamgc** (every ipamgc mode), after the idle phase: SIGUSR1 to the watcher runs its periodic pass
  now (`ipamgc/commands/watch.py`).  A pass's window runs from the signal until the watcher has written
  a new `P:state` `last_full_resync` (at the end of its pass) and the work it made has drained: every
  `dirty:{s}` and `inflight:{s}` empty, no job waiting (`Probe.quiescent`).  Its CPU is that of every
  ipamgc process and Redis over the window, minus the idle phase's rate × the window.  Each pass starts
  once the previous pass's shard jobs have ended (unmeasured: a drained job lingers in a blocked read);
- **Calico's binary** cannot be asked: its IPAM controller runs a full scan on a ticker of leak grace / 2
  (Calico 3.33, kube-controllers/pkg/controllers/node/ipam.go, logging "Performing a full scan of IPAM
  allocations" at each), and a changed KubeControllersConfiguration restarts it.  So a third start of the
  binary on the same seeded cluster, at `calico_backstop_grace` (60 s: a scan every 30 s), no events:
  each window runs from the end of one scan (the process quiet again) to the end of the next; its CPU,
  minus the cost run's idle rate (at the 15-minute grace: no scan in it) × the window, divided by the
  scans logged in the window, is one pass.

`summary` gives the report's `backstop` (per mode: the median pass and every pass), `hourly` the CPU a
second at 0, 2 and 20 pod events a second with a pass every 450 s: idle + rate × the churn's CPU per
event net of idle + one pass / 450 s, derived from the measured parts (no run lasts an hour).
"""

from __future__ import annotations

import math
import signal
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from lab.bench import measure, sweep
from lab.bench.procs import process_env

if TYPE_CHECKING:  # the runs import this module
    from lab.bench.calico import CalicoRun
    from lab.bench.observe import Observing

__all__ = [
    "HOURLY_RATES",
    "PRODUCTION_PASS_PERIOD_SECONDS",
    "calico_passes",
    "hourly",
    "ipamgc_passes",
    "summary",
]

# The production default: a 15-minute leak grace period, one periodic pass every grace / 2 (Calico's
# ticker; ipamgc's `--resync-period` default follows it).
PRODUCTION_PASS_PERIOD_SECONDS = 450.0
# The pod event rates of `hourly`: a quiet cluster, a few events a second (most clusters), a busy one.
HOURLY_RATES = (0.0, 2.0, 20.0)
# The longest wait for the previous pass's shard jobs to end (they linger `--job-idle`, 10 s, after their
# last work; a job lives at most 90 s).
JOBS_SETTLE_SECONDS = 60.0
# Calico: how long beyond one ticker period to wait for its next scan (a scan that overran the period
# delays the next tick's receipt).
SCAN_WAIT_MARGIN_SECONDS = 60.0

IPAMGC_METHOD = (
    "SIGUSR1 to the watcher (its periodic backstop pass, now); the window ends when the watcher has "
    "written a new P:state last_full_resync and every dirty:{s} and inflight:{s} is empty with no job "
    "waiting; CPU of the watcher, workers, leader and Redis over the window minus the idle phase's rate "
    "× the window; each pass starts once the previous pass's shard jobs have ended (their linger after "
    "draining, a blocked read, is not counted)"
)


def _calico_method(grace: float, cost_grace: float) -> str:
    return (
        f"differential: a third start of the binary at grace {grace:g} s (its full scan every "
        f"{grace / 2:g} s on Calico's ticker, which cannot be triggered), no events; each window runs "
        "from the end of one scan (quiet: the process under 20 ms of CPU in 1 s) to the end of the next; "
        f"its CPU minus the cost run's idle rate (grace {cost_grace:g} s: no scan in it) × the window, "
        "divided by the scans logged in it ('Performing a full scan of IPAM allocations')"
    )


def _net(gross: float, idle_rate: float | None, wall: float) -> float | None:
    return None if idle_rate is None else round(gross - idle_rate * wall, 4)


def _idle_rate(result: Mapping[str, Any]) -> float | None:
    """CPU seconds a second of the run's idle phase (all processes), None without one; from its CPU and
    wall time where given (its `cpu_per_second` is rounded to 0.1 ms/s)."""
    idle = (result.get("phases") or {}).get("idle") or {}
    total, wall = idle.get("cpu_seconds", {}).get("total"), idle.get("wall_seconds")
    if isinstance(total, (int, float)) and isinstance(wall, (int, float)) and wall > 0:
        return total / wall
    rate = idle.get("cpu_per_second", {}).get("total")
    return float(rate) if isinstance(rate, (int, float)) else None


def _resync_changed(run: Observing, before: bytes | None) -> Callable[[], bool]:
    return lambda: run.probe.last_full_resync() != before


def _scans_above(run: CalicoRun, count: int) -> Callable[[], bool]:
    return lambda: run.log.count("full-scan") > count


# -- ipamgc: SIGUSR1 to the watcher ----------------------------------------------------------------------


def ipamgc_passes(run: Observing) -> None:
    """`backstop_passes` passes of the watcher's periodic backstop, one at a time, into
    `run.result["backstop"]` (each pass a phase's figures, events = the allocations of the cluster)."""
    cfg = run.cfg
    (watcher,) = run.fleet.watchers()
    backstop_kind = process_env(watcher.pid).get("IPAMGC_BACKSTOP") or "default"
    rate = _idle_rate(run.result)
    allocations = len(run.sim.truth.in_use_ips())
    run.say(f"{run.mode}: backstop, {cfg.backstop_passes} periodic pass(es) on SIGUSR1")
    passes: list[dict[str, Any]] = []
    for i in range(cfg.backstop_passes):
        run.wait("the shard jobs to end before a pass", run.probe.jobs_done, JOBS_SETTLE_SECONDS)
        before = run.probe.last_full_resync()
        start = run.start_phase()
        watcher.popen.send_signal(signal.SIGUSR1)
        ended = run.wait("the watcher's periodic pass to end", _resync_changed(run, before))
        pass_seconds = time.monotonic() - start.monotonic
        run.wait("the pass's work to drain", run.probe.quiescent)
        end = run.reading()
        phase = measure.phase_cost(start, end, run.fleet, allocations)
        gross = phase["cpu_seconds"]["total"]
        phase.update(
            {
                "events_are": "allocations (one periodic pass)",
                "pass": i + 1,
                "ended": ended,
                "pass_ended_seconds": round(pass_seconds, 3),
                "pass_cpu_seconds_gross": gross,
                "pass_cpu_seconds": _net(gross, rate, phase["wall_seconds"]),
            }
        )
        passes.append(phase)
        run.say(
            f"  pass {i + 1}: {phase['wall_seconds']} s, {gross} CPU s "
            f"(net of idle {phase['pass_cpu_seconds']})"
        )
    run.wait("the last pass's shard jobs to end", run.probe.jobs_done, JOBS_SETTLE_SECONDS)
    run.result["backstop"] = {
        "passes": passes,
        "allocations": allocations,
        "idle_cpu_per_second": round(rate, 6) if rate is not None else None,
        "method": IPAMGC_METHOD,
        # What the watcher's pass runs, as its environment says (`IPAMGC_BACKSTOP`: `sweep`, `full`;
        # inherited from the shell that ran the benchmark); "default" when unset.
        "watcher_backstop": backstop_kind,
    }


# -- Calico's binary: a run at a short grace, one window per scan of its ticker -----------------------


def calico_passes(run: CalicoRun) -> None:
    """The binary's backstop run (`calico_backstop_grace`): `backstop_passes` windows, each from the end
    of one periodic full scan to the end of the next, into `run.result["backstop"]`."""
    cfg = run.cfg
    grace = cfg.calico_backstop_grace
    budget = grace / 2 + SCAN_WAIT_MARGIN_SECONDS
    rate = _idle_rate(run.result)  # the cost run's idle: at its 15-minute grace, no scan falls in it
    passes: list[dict[str, Any]] = []
    with run.cluster(grace, "backstop"):
        allocations = len(run.sim.truth.in_use_ips())
        run.start("backstop")
        run.wait("Calico's syncer to be in sync", lambda: run.log.count("in-sync") > 0)
        run.wait("kube-controllers to go quiet after its first sync", run.quiet)
        run.say(f"{run.mode}: backstop, {cfg.backstop_passes} periodic full scan(s) at grace {grace:g} s")
        seen = run.log.count("full-scan")
        run.wait("Calico's next periodic full scan", lambda: run.log.count("full-scan") > seen, budget)
        run.wait("kube-controllers to go quiet after a full scan", run.quiet)
        start, count = run.start_phase(), run.log.count("full-scan")
        for i in range(cfg.backstop_passes):
            before = count
            ended = run.wait("Calico's next periodic full scan", _scans_above(run, before), budget)
            run.wait("kube-controllers to go quiet after a full scan", run.quiet)
            end = run.reading()
            count = run.log.count("full-scan")
            scans = count - before
            phase = run.phase(start, end, allocations)
            gross = phase["cpu_seconds"]["total"]
            net = _net(gross, rate, phase["wall_seconds"])
            phase.update(
                {
                    "events_are": "allocations (one periodic pass)",
                    "pass": i + 1,
                    "ended": ended and scans > 0,
                    "scans": scans,
                    "pass_cpu_seconds_gross": round(gross / scans, 4) if scans else None,
                    "pass_cpu_seconds": round(net / scans, 4) if scans and net is not None else None,
                }
            )
            passes.append(phase)
            run.say(
                f"  window {i + 1}: {phase['wall_seconds']} s, {scans} scan(s), {gross} CPU s "
                f"(a scan net of idle {phase['pass_cpu_seconds']})"
            )
            start = run.start_phase()
    run.result["backstop"] = {
        "passes": passes,
        "allocations": allocations,
        "idle_cpu_per_second": round(rate, 6) if rate is not None else None,
        "grace_seconds": grace,
        "method": _calico_method(grace, cfg.calico_grace),
    }
    run.result["runs"]["backstop"] = {"grace_seconds": grace, "phases": ["backstop"]}


# -- the report ------------------------------------------------------------------------------------------


def _median(values: Sequence[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return round(statistics.median(got), 4) if got else None


def summary(modes: Mapping[str, Any]) -> dict[str, Any] | None:
    """The report's `backstop`: per mode that ran the phase, the median pass (`pass_cpu_seconds`, net of
    idle; None without an idle phase), every pass, the allocations and the method; None when no mode
    ran it (`--backstop-passes 0`)."""
    out: dict[str, Any] = {}
    for mode, result in modes.items():
        b = result.get("backstop") if isinstance(result, Mapping) else None
        if not isinstance(b, Mapping):
            continue
        done = [p for p in b["passes"] if p.get("ended")]
        net = [p.get("pass_cpu_seconds") for p in done]
        median = _median(net)
        allocations = int(b["allocations"])
        roles = sorted({r for p in done for r in p["cpu_seconds"] if r != "total"})
        rate = b.get("idle_cpu_per_second")
        out[mode] = {
            "pass_cpu_seconds": median,
            "pass_cpu_seconds_gross": _median([p.get("pass_cpu_seconds_gross") for p in done]),
            "passes": net,
            "passes_gross": [p.get("pass_cpu_seconds_gross") for p in done],
            "passes_not_ended": len(b["passes"]) - len(done),
            "pass_cpu_us_per_allocation": (
                round(1e6 * median / allocations, 2) if median is not None and allocations else None
            ),
            "pass_wall_seconds": _median([p["wall_seconds"] for p in done]),
            "cpu_seconds_by_role": {r: _median([p["cpu_seconds"].get(r) for p in done]) for r in roles},
            "allocations": allocations,
            "idle_cpu_ms_per_second": round(1000 * rate, 3) if isinstance(rate, (int, float)) else None,
            "method": b["method"],
        }
        if "watcher_backstop" in b:
            out[mode]["watcher_backstop"] = b["watcher_backstop"]
    return out or None


def _churn_phases(config: Mapping[str, Any], result: Mapping[str, Any]) -> dict[float, Mapping[str, Any]]:
    """A mode's churn phases by pod event rate: the sweep's (`churn_by_rate`) or the single one."""
    phases = result.get("phases") or {}
    swept = phases.get("churn_by_rate")
    if swept:
        return {float(label): p for label, p in swept.items()}
    if phases.get("churn"):
        return {float(config["churn_rate"]): phases["churn"]}
    return {}


def _nearest(rates: Sequence[float], rate: float) -> float:
    """The measured rate closest to `rate` by ratio (a batch's cost depends on the rate, not the gap)."""
    return min(rates, key=lambda r: (abs(math.log(r / rate)), r))


def hourly(
    config: Mapping[str, Any],
    modes: Mapping[str, Any],
    backstop: Mapping[str, Any] | None,
    calicos: Sequence[str] = (),
) -> dict[str, Any] | None:
    """The report's `hourly`: per mode of `backstop` and per rate of `HOURLY_RATES`, CPU ms a second with
    one pass every `PRODUCTION_PASS_PERIOD_SECONDS`: the idle phase's rate + rate × the CPU per pod event
    net of idle of the churn phase nearest that rate + one pass (net of idle) / the period.  Derived from
    measured parts; a part not measured makes the total None.  None without a backstop phase."""
    if not backstop:
        return None
    by_mode: dict[str, Any] = {}
    for mode, b in backstop.items():
        result = modes.get(mode) or {}
        idle = b.get("idle_cpu_ms_per_second")
        churns = _churn_phases(config, result)
        pass_cpu = b.get("pass_cpu_seconds")
        passes_ms = (
            round(1000 * pass_cpu / PRODUCTION_PASS_PERIOD_SECONDS, 4) if pass_cpu is not None else None
        )
        rows: dict[str, Any] = {}
        for rate in HOURLY_RATES:
            events_ms: float | None = 0.0
            source: float | None = None
            if rate:
                events_ms = None
                if churns:
                    source = _nearest(sorted(churns), rate)
                    per_event = (churns[source].get("net_of_idle") or {}).get("cpu_per_event_us", {})
                    us = per_event.get("total")
                    events_ms = round(rate * us / 1000, 4) if isinstance(us, (int, float)) else None
            parts = (idle, events_ms, passes_ms)
            total = round(sum(p for p in parts if p is not None), 3) if None not in parts else None
            rows[sweep.rate_label(rate)] = {
                "cpu_ms_per_second": total,
                "cpu_seconds_per_hour": round(total * 3.6, 2) if total is not None else None,
                "idle_ms_per_second": idle,
                "events_ms_per_second": events_ms,
                "passes_ms_per_second": passes_ms,
                "per_event_from_churn_rate": source,
            }
        by_mode[mode] = rows
    ratios: dict[str, dict[str, float | None]] = {}
    crossings: dict[str, float | None] = {}
    ours = by_mode.get(sweep.INCREMENTAL)
    for calico in calicos:
        theirs = by_mode.get(calico)
        if ours is None or theirs is None:
            continue
        ratios[calico] = {}
        points: list[tuple[float, float, float]] = []
        for rate in HOURLY_RATES:
            label = sweep.rate_label(rate)
            a, b2 = ours[label]["cpu_ms_per_second"], theirs[label]["cpu_ms_per_second"]
            ratios[calico][label] = round(a / b2, 2) if a is not None and b2 else None
            if a is not None and b2 is not None:
                points.append((rate, a, b2))
        if len(points) == len(HOURLY_RATES):
            crossings[calico] = sweep.crossover(points)
    return {
        "pass_period_seconds": PRODUCTION_PASS_PERIOD_SECONDS,
        "rates": list(HOURLY_RATES),
        "derived": (
            "from measured parts, not measured over an hour: the idle phase's CPU a second + rate × the "
            "CPU per pod event net of idle of the churn phase nearest that rate (per_event_from_churn_rate) "
            "+ one periodic pass net of idle (backstop.pass_cpu_seconds) / "
            f"{PRODUCTION_PASS_PERIOD_SECONDS:g} s "
            "(a 15-minute leak grace period, a pass every grace / 2); ipamgc's handle scan is not in it"
        ),
        "by_mode": by_mode,
        "incremental_over_calico": ratios,
        # The rate below which ipamgc costs more CPU a second than each Calico mode, passes included
        # (`sweep.crossover` on the three rates: interpolated linearly; None when above 20 events/s).
        "crossover_events_per_second": crossings,
    }


def table_lines(report: Mapping[str, Any]) -> list[str]:
    """The table's lines for `backstop` and `hourly` ([] when the phase did not run)."""
    b, h = report.get("backstop"), report.get("hourly")
    if not b:
        return []

    def fmt(v: Any) -> str:
        return "-" if v is None else f"{v:,.3g}" if abs(v) < 100 else f"{v:,.0f}"

    lines = ["", "backstop, one periodic pass (CPU s net of idle, median; each pass):"]
    for mode, s in b.items():
        each = ", ".join(fmt(v) for v in s["passes"])
        kind = f"; the watcher's backstop: {s['watcher_backstop']}" if "watcher_backstop" in s else ""
        lines.append(
            f"  {mode:<14} {fmt(s['pass_cpu_seconds'])} ({each}); gross {fmt(s['pass_cpu_seconds_gross'])}; "
            f"{s['allocations']:,} allocations, {fmt(s['pass_cpu_us_per_allocation'])} µs each{kind}"
        )
    if h:
        modes = list(h["by_mode"])
        lines += [
            "",
            f"CPU ms a second, a pass every {h['pass_period_seconds']:g} s "
            "(derived: idle + events + passes):",
            f"{'events/s':>9} " + " ".join(f"{m:>16}" for m in modes),
        ]
        for rate in h["rates"]:
            label = sweep.rate_label(rate)
            cells = [fmt(h["by_mode"][m][label]["cpu_ms_per_second"]) for m in modes]
            lines.append(f"{label:>9} " + " ".join(f"{c:>16}" for c in cells))
        for mode, rate in h["crossover_events_per_second"].items():
            said = "above 20 events/s" if rate is None else f"{fmt(rate)} events/s"
            lines.append(f"ipamgc costs more CPU a second than {mode}, passes included, below: {said}")
    return lines
