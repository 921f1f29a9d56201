"""The benchmark's verdict: ratios between the modes, the targets of issue 11, and a short table.

Why a module of its own: the claim "cost follows the rate of change, not the size of the cluster" is made
here, as ratios of each baseline to incremental measured in the same run (full-scan, Calico 3.26, and
per-node, Calico 3.30–3.33; these machines are noisy: absolute CPU figures drift from run to run, ratios
taken minutes apart hold), and as targets that say where they apply (most are stated for 150,000 pods or
10,000 pods; at other sizes they are reported, not judged).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lab.bench import backstop, nodechurn, sweep

SCHEMA = "ipamgc-bench/1"
BIG = 150_000  # pods: the size most targets are stated for
SMALL = 10_000  # pods: #7841's size, where the full-scan ratio is stated
# The report key of each baseline's ratios over incremental (both always present; {} when not run).
RATIO_KEYS = {
    "full-scan": "ratios_full_scan_over_incremental",
    "per-node": "ratios_per_node_over_incremental",
    "calico": "ratios_calico_over_incremental",
}
# Calico's own binary, when several versions ran: every `calico-<name>` mode's ratios, by mode.
CALICO_RATIOS_BY_MODE = "ratios_calico_over_incremental_by_mode"
CALICO_OVER_COMBINED = "ratios_calico_over_combined"


def calico_modes(modes: Mapping[str, Any]) -> list[str]:
    """The modes that ran Calico's own binary (`calico`, `calico-<name>`), in run order."""
    return [m for m, v in modes.items() if (m == "calico" or m.startswith("calico-")) and _get(v, "phases")]


def _get(d: Mapping[str, Any] | None, *path: str) -> Any:
    node: Any = d
    for step in path:
        if not isinstance(node, Mapping):
            return None
        node = node.get(step)
    return node


def ratios(
    modes: Mapping[str, Any], over: str = "full-scan", base: str = "incremental"
) -> dict[str, float | None]:
    """`over` ÷ `base` (full-scan ÷ incremental by default) for the figures where the difference is the
    point; {} unless both modes ran."""
    inc, full = modes.get(base), modes.get(over)
    if not isinstance(inc, Mapping) or not isinstance(full, Mapping) or "phases" not in full:
        return {}
    out: dict[str, float | None] = {}
    for name, path in {
        "churn_cpu_per_event": ("churn", "cpu_per_event_us", "total"),
        "churn_cpu_per_event_net_of_idle": ("churn", "net_of_idle", "cpu_per_event_us", "total"),
        "churn_redis_commands_per_event": ("churn", "redis_commands_per_event"),
        "churn_workers_cpu": ("churn", "cpu_seconds", "workers"),
        "churn_redis_cpu": ("churn", "cpu_seconds", "redis"),
        "node_loss_cpu": ("node_loss", "cpu_seconds", "total"),
        "idle_cpu_per_second": ("idle", "cpu_per_second", "total"),
        "cold_start_cpu": ("cold_start", "cpu_seconds", "total"),
    }.items():
        out[name] = _ratio(_get(inc, "phases", *path), _get(full, "phases", *path), 1)
    # Memory over the whole run: the sum of each process's highest peak (`peak_rss_mib_all`).
    out["peak_rss_all"] = _ratio(
        _get(inc, "peak_rss_mib_all", "sum"), _get(full, "peak_rss_mib_all", "sum"), 2
    )
    return out


def _ratio(a: object, b: object, digits: int) -> float | None:
    """b ÷ a, rounded; None unless both are numbers and `a` is not 0."""
    return round(b / a, digits) if isinstance(a, (int, float)) and a and isinstance(b, (int, float)) else None


# Ratios with no meaning for Calico's binary, which has no workers and no Redis: kept as keys, set to None.
_NOT_CALICO = ("churn_redis_commands_per_event", "churn_workers_cpu", "churn_redis_cpu")


def _calico_ratios(modes: Mapping[str, Any], mode: str, base: str = "incremental") -> dict[str, float | None]:
    out = ratios(modes, mode, base)
    return {k: (None if k in _NOT_CALICO else v) for k, v in out.items()}


def _target(
    name: str, want: str, value: Any, ok: bool | None, applies: bool, note: str = ""
) -> dict[str, Any]:
    met = ok if (applies and ok is not None and value is not None) else None
    return {"target": name, "want": want, "value": value, "met": met, "applies_here": applies, "note": note}


def targets(
    config: Mapping[str, Any],
    modes: Mapping[str, Any],
    ratio: Mapping[str, Any],
    compare: Any = None,
    per_node_ratio: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Issue 11's targets, judged where they apply (`met` None: not at this size, or not measured).

    `ratio` is full-scan ÷ incremental, `per_node_ratio` per-node ÷ incremental (from `modes` when not
    given).  Figures are incremental mode's, except "IPs released while in use", summed over every mode."""
    pods = int(config["pods"])
    big, small = pods >= BIG, SMALL <= pods < BIG
    inc = modes.get("incremental") if isinstance(modes.get("incremental"), Mapping) else None
    if per_node_ratio is None:
        per_node_ratio = ratios(modes, "per-node")
    out: list[dict[str, Any]] = []

    def num(*path: str) -> Any:
        return _get(inc, "phases", *path)

    def at_most(name: str, want: float, unit: str, value: Any, applies: bool, note: str = "") -> None:
        ok = value is not None and value <= want
        out.append(_target(name, f"≤ {want:g}{unit}", value, ok, applies, note))

    def at_least(name: str, want: float, value: Any, applies: bool) -> None:
        out.append(_target(name, f"≥ {want:g}", value, value is not None and value >= want, applies))

    per_event = num("churn", "cpu_per_event_us", "total")
    # -- at 10,000 pods (#7841's size) ---------------------------------------------------------------------
    at_most("CPU per pod event at 10k pods", 500, " µs", per_event, small, "churn, all processes")
    commands = num("churn", "redis_commands_per_event")
    at_most("Redis commands per pod event at 10k pods", 8, "", commands, small, "churn")
    at_least("full-scan ÷ incremental CPU per event at 10k pods", 10, ratio.get("churn_cpu_per_event"), small)
    per_node = per_node_ratio.get("churn_cpu_per_event")
    at_least("per-node ÷ incremental CPU per event at 10k pods", 3, per_node, small)
    idle = num("idle", "cpu_per_second", "total")
    idle_ms = round(idle * 1000, 2) if isinstance(idle, (int, float)) else None
    at_most("idle CPU per second at 10k pods", 5, " ms", idle_ms, small, "idle phase, all processes")
    # -- at 150,000 pods -----------------------------------------------------------------------------------
    at_most("CPU per pod event at 150k pods", 500, " µs", per_event, big, "churn, all processes")
    if compare is not None:
        base = _get(compare, "modes", "incremental", "phases", "churn", "cpu_per_event_us", "total")
        base_pods = _get(compare, "config", "pods")
        r = round(per_event / base, 2) if per_event and base else None
        at_most(f"CPU per event here ÷ at {base_pods} pods", 1.3, "", r, big, "against --compare FILE")
    at_least("per-node ÷ incremental CPU per event at 150k pods", 10, per_node, big)
    cold = num("cold_start", "wall_seconds")
    at_most("cold start at 150k pods", 15, " s", cold, big, "wall")
    at_most("watcher peak RSS at 150k pods", 250, " MiB", _peak(inc, "watcher"), big)
    at_most("Redis peak RSS at 150k pods", 200, " MiB", _peak(inc, "redis"), big)
    # -- at every size -------------------------------------------------------------------------------------
    leader = bool(config.get("leader"))
    p99 = num("churn", "leak_to_release_minus_grace", "p99")
    measured = "release"
    if p99 is None and not leader:
        p99, measured = num("churn", "leak_to_decision_minus_grace", "p99"), "decision (no leader)"
    at_most("leak release p99 − grace", 2, " s", p99, True, f"leak → {measured}")
    out.append(_every_leak_released(modes, leader))
    lost = num("node_loss", "per_node") or {}
    worst = max((v.get("all_released_seconds") or float("inf") for v in lost.values()), default=None)
    note = f"{config.get('node_loss_pods')} pods a node, {len(lost)} nodes at once"
    at_most(
        "deleted node cleaned",
        5,
        " s",
        worst if worst != float("inf") else None,
        bool(lost) and leader,
        note,
    )
    violations = sum(len(m.get("violations") or []) for m in modes.values() if isinstance(m, Mapping))
    out.append(_target("IPs released while in use", "0", violations, violations == 0, True, "all modes"))
    return out


def _left_over(mode: Any, leader: bool) -> int | None:
    """The churn leaks a mode did not release (did not decide, without a leader); None: not measured."""
    key, field = (
        ("leak_to_release_minus_grace", "unreleased")
        if leader
        else ("leak_to_decision_minus_grace", "undecided")
    )
    value = _get(mode, "phases", "churn", key, field)
    return value if isinstance(value, int) else None


def _every_leak_released(modes: Mapping[str, Any], leader: bool) -> dict[str, Any]:
    """Incremental's churn leaks all released; per-node's left-overs are noted (late by design)."""
    value = _left_over(modes.get("incremental"), leader)
    note = "churn leaks " + ("unreleased" if leader else "undecided (no leader)")
    per_node = _left_over(modes.get("per-node"), leader)
    if per_node is not None:
        note += f"; per-node, which confirms late by design: {per_node}"
    return _target("every leak released", "0 left", value, value == 0, True, note)


def _peak(mode: Mapping[str, Any] | None, role: str) -> float | None:
    values = [
        v
        for phase in (_get(mode, "phases") or {}).values()
        if isinstance(v := _get(phase, "peak_rss_mib", role), (int, float))
    ]
    return max(values) if values else None


def build(
    config: Mapping[str, Any],
    modes: Mapping[str, Any],
    machine: Mapping[str, Any],
    command: str,
    compare: Any = None,
) -> dict[str, Any]:
    ratio, per_node = ratios(modes, "full-scan"), ratios(modes, "per-node")
    calicos = calico_modes(modes)
    by_mode = {m: _calico_ratios(modes, m) for m in calicos}
    passes = backstop.summary(modes)
    return {
        "schema": SCHEMA,
        "command": command,
        "machine": dict(machine),
        "config": dict(config),
        "modes": dict(modes),
        RATIO_KEYS["full-scan"]: ratio,
        RATIO_KEYS["per-node"]: per_node,
        # Calico's own binary ÷ incremental (the first binary when several ran; all of them by mode below).
        RATIO_KEYS["calico"]: by_mode[calicos[0]] if calicos else {},
        CALICO_RATIOS_BY_MODE: by_mode,
        # The first Calico binary ÷ `ipamgc combined` (the one-process mode), {} unless both ran.
        CALICO_OVER_COMBINED: _calico_ratios(modes, calicos[0], "combined") if calicos else {},
        "targets": targets(config, modes, ratio, compare, per_node),
        # `--churn 1,5,20,50`: CPU a second and per event at each rate, and where ipamgc and Calico cross
        # (`lab/bench/sweep.py`); None for a single-rate run.
        "churn_sweep": sweep.summary(modes, calicos),
        # `--backstop-passes N`: one periodic pass of each collector (per mode: the median, each pass,
        # the method), and CPU a second at 0, 2 and 20 pod events/s with a pass every 450 s, derived from
        # the measured parts (`lab/bench/backstop.py`); both None without the phase.
        "backstop": passes,
        "hourly": backstop.hourly(config, modes, passes, calicos),
    }


def _fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.3g}{unit}" if abs(v) < 100 else f"{v:,.0f}{unit}"
    return f"{v:,}{unit}" if isinstance(v, int) else f"{v}{unit}"


def _phase_row(mode: str, name: str, p: Mapping[str, Any]) -> str:
    cpu, rss = p["cpu_seconds"], p["peak_rss_mib"]
    if "kube-controllers" in cpu:  # Calico's binary: one process, no Redis
        cells = [
            f"{mode:<12} {name[:11]:<11} {_fmt(p['wall_seconds']):>7} {_fmt(cpu['total']):>7}",
            f"{'one Go process':>27}",
            f"{_fmt(p['events']):>7} {_fmt(_get(p, 'cpu_per_event_us', 'total')):>9}",
            f"{'-':>7}",
            f"{_fmt(rss.get('kube-controllers')):>12}",
            f"  {_fmt(_get(p, 'api_requests', 'total'))} API requests",
        ]
        return " ".join(cells)
    if "combined" in cpu:  # `ipamgc combined`: watcher, worker and leader in one process, and Redis
        cells = [
            f"{mode:<12} {name:<11} {_fmt(p['wall_seconds']):>7} {_fmt(cpu['total']):>7}",
            f"{_fmt(cpu.get('combined')):>13} in one  {_fmt(cpu.get('redis')):>6}",
            f"{_fmt(p['events']):>7} {_fmt(_get(p, 'cpu_per_event_us', 'total')):>9}",
            f"{_fmt(p.get('redis_commands_per_event')):>7}",
            f"{_fmt(rss.get('combined')):>5}/{_fmt(rss.get('redis'))}",
        ]
        return " ".join(cells)
    cells = [
        f"{mode:<12} {name:<11} {_fmt(p['wall_seconds']):>7} {_fmt(cpu['total']):>7}",
        *(f"{_fmt(cpu.get(role)):>6}" for role in ("watcher", "workers", "leader", "redis")),
        f"{_fmt(p['events']):>7} {_fmt(_get(p, 'cpu_per_event_us', 'total')):>9}",
        f"{_fmt(p.get('redis_commands_per_event')):>7}",
        f"{_fmt(rss.get('watcher')):>5}/{_fmt(rss.get('redis'))}",
    ]
    return " ".join(cells)


def _mode_notes(m: Mapping[str, Any]) -> list[str]:
    pad = " " * 12
    lines = []
    churn = m["phases"].get("churn", {})
    net = _get(churn, "net_of_idle")
    if net:
        per = net["cpu_per_event_us"]
        parts = (
            ", ".join(
                f"{role} {_fmt(per.get(role))}"
                for role in ("watcher", "workers", "leader", "redis", "combined")
                if role in per
            )
            or "one process"
        )
        lines.append(
            f"{pad} churn net of idle: {_fmt(per['total'])} µs/event ({parts}), "
            f"{_fmt(net['redis_commands_per_event'])} cmd/event"
        )
    threads = churn.get("watcher_threads_cpu_per_event_us")
    if threads:
        parts = ", ".join(f"{name} {_fmt(us)}" for name, us in list(threads.items())[:5])
        lines.append(f"{pad} churn, the watcher's threads: {parts} µs/event")
    for key in ("leak_to_release_minus_grace", "leak_to_decision_minus_grace"):
        lat = churn.get(key)
        if lat:
            what = key.replace("_", " ")
            p50, p99 = _fmt(lat["p50"], " s"), _fmt(lat["p99"], " s")
            left = lat.get("unreleased", lat.get("undecided")) or 0
            also = f", {left} not {'released' if 'unreleased' in lat else 'decided'}" if left else ""
            lines.append(f"{pad} {what}: p50 {p50}, p99 {p99} ({lat['count']} leaks{also})")
    if "leak_latency_from" in churn:
        lines.append(
            f"{pad} cost run at grace {_fmt(churn.get('grace_seconds'), ' s')} "
            f"({churn.get('candidates_logged')} of {churn.get('leaks')} leaks logged as candidates); "
            f"latency from {churn['leak_latency_from']}"
        )
    if m.get("restarts"):
        lines.append(f"{pad} kube-controllers restarted itself {m['restarts']} time(s), started again")
    limit = churn.get("leak_wait_limit_seconds")
    if limit is not None:
        lines.append(f"{pad} leaks waited for at most {_fmt(limit, ' s')} once nothing was pending")
    nodes = _get(m, "phases", "node_loss", "per_node") or {}
    if nodes:
        done = ", ".join(f"{n} {_fmt(v.get('all_released_seconds'), ' s')}" for n, v in nodes.items())
        lines.append(f"{pad} lost nodes' IPs all released after: {done}")
    memory = m.get("peak_rss_mib_all")
    if memory:
        each = ", ".join(f"{n} {_fmt(v)}" for n, v in memory["by_process"].items())
        lines.append(
            f"{pad} peak RSS over the run, each process's highest summed: {_fmt(memory['sum'])} MiB ({each})"
        )
    return lines


def table(report: Mapping[str, Any]) -> str:
    """A short plain-text summary: one line per mode and phase, the ratios over incremental (per-node's,
    full-scan's), the targets."""
    c = report["config"]
    lines = [
        f"ipamgc bench: {c['nodes']:,} nodes, {c['pods']:,} pods; churn {c['churn_rate']:g}/s for "
        f"{c['churn_seconds']:g} s, {100 * c['leak_rate']:g} % of deletions leak; "
        f"node loss {c['node_loss']} × {c['node_loss_pods']} pods; grace {c['grace']:g} s; "
        f"{c['workers']} workers, {c['shards']} shards; leader {'on' if c['leader'] else 'off'}",
        "",
        f"{'mode':<12} {'phase':<11} {'wall s':>7} {'CPU s':>7} {'watch':>6} {'work':>6} {'lead':>6} "
        f"{'redis':>6} {'events':>7} {'µs/event':>9} {'cmd/ev':>7} {'RSS w/r MiB':>12}",
    ]
    for mode, m in report["modes"].items():
        if not isinstance(m, Mapping) or "phases" not in m:
            lines.append(f"{mode:<12} {_get(m, 'skipped') or _get(m, 'error') or 'not run'}")
            continue
        for name, p in m["phases"].items():
            if name == "churn_by_rate":  # the sweep's phases, one row a rate (`churn@<rate>`)
                lines += [_phase_row(mode, f"churn@{rate}", q) for rate, q in p.items()]
            else:
                lines.append(_phase_row(mode, name, p))
        lines += _mode_notes(m)
        if m.get("error"):
            lines.append(f"{'':<12} failed: {m['error']}")
    listed = {
        "per-node ÷ incremental": report.get(RATIO_KEYS["per-node"]),
        "full-scan ÷ incremental": report.get(RATIO_KEYS["full-scan"]),
        **{f"{m} ÷ incremental": r for m, r in (report.get(CALICO_RATIOS_BY_MODE) or {}).items()},
        "calico ÷ combined": report.get(CALICO_OVER_COMBINED),
    }
    ratio_lines = [
        f"{label}: " + ", ".join(f"{k} {_fmt(v)}×" for k, v in ratio.items() if v is not None)
        for label, ratio in listed.items()
        if ratio
    ]
    if ratio_lines:
        lines += ["", *ratio_lines]
    lines += _sweep_lines(report.get("churn_sweep"))
    lines += backstop.table_lines(report)
    lines += nodechurn.table_lines(report)
    lines += ["", "targets:"]
    for t in report["targets"]:
        mark = {True: "met   ", False: "MISSED", None: "n/a   "}[t["met"]]
        note = f" ({t['note']})" if t["note"] else ""
        lines.append(f"  {mark} {t['target']}: {_fmt(t['value'])} (want {t['want']}){note}")
    return "\n".join(lines)


def _sweep_lines(swept: Mapping[str, Any] | None) -> list[str]:
    """`--churn 1,5,…`: CPU a second (and per event) of each mode at each rate, idle first; the crossover."""
    if not swept:
        return []
    modes = list(swept["idle_cpu_ms_per_second"]) or list(next(iter(swept["by_rate"].values()), {}))
    lines = [
        "",
        "CPU ms a second (µs per pod event) by rate:",
        f"{'events/s':>9} " + " ".join(f"{m:>22}" for m in modes),
    ]
    idle = swept["idle_cpu_ms_per_second"]
    lines.append(f"{'idle':>9} " + " ".join(f"{_fmt(idle.get(m)):>22}" for m in modes))
    for rate, row in swept["by_rate"].items():
        cells = []
        for m in modes:
            point = row.get(m, {})
            cells.append(f"{_fmt(point.get('cpu_ms_per_second'))} ({_fmt(point.get('cpu_per_event_us'))})")
        lines.append(f"{rate:>9} " + " ".join(f"{c:>22}" for c in cells))
    for mode, rate in swept.get("crossover_by_mode", {}).items():
        said = "above every rate measured" if rate is None else f"{_fmt(rate)} events/s"
        lines.append(f"ipamgc costs more CPU a second than {mode} below: {said}")
    return lines
