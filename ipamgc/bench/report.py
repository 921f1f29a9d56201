"""The benchmark's verdict: ratios between the modes, the targets of issue 7, and a short table.

Why a module of its own: the claim "cost follows the rate of change, not the size of the cluster" is made
here, as a ratio of full-scan to incremental measured in the same run (these machines are noisy: absolute
CPU figures drift from run to run, ratios taken minutes apart hold), and as targets that say where they
apply (most are stated for 150,000 pods or 10,000 pods; at other sizes they are reported, not judged).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SCHEMA = "ipamgc-bench/1"
BIG = 150_000  # pods: the size most targets are stated for
SMALL = 10_000  # pods: #7841's size, where the full-scan ratio is stated


def _get(d: Mapping[str, Any] | None, *path: str) -> Any:
    node: Any = d
    for step in path:
        if not isinstance(node, Mapping):
            return None
        node = node.get(step)
    return node


def ratios(modes: Mapping[str, Any]) -> dict[str, float | None]:
    """full-scan ÷ incremental for the figures where the difference is the point."""
    inc, full = modes.get("incremental"), modes.get("full-scan")
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
    }.items():
        a, b = _get(inc, "phases", *path), _get(full, "phases", *path)
        out[name] = (
            round(b / a, 1) if isinstance(a, (int, float)) and a and isinstance(b, (int, float)) else None
        )
    return out


def _target(
    name: str, want: str, value: Any, ok: bool | None, applies: bool, note: str = ""
) -> dict[str, Any]:
    met = ok if (applies and ok is not None and value is not None) else None
    return {"target": name, "want": want, "value": value, "met": met, "applies_here": applies, "note": note}


def targets(
    config: Mapping[str, Any], modes: Mapping[str, Any], ratio: Mapping[str, Any], compare: Any = None
) -> list[dict[str, Any]]:
    """Issue 7's targets, judged where they apply (`met` None: not at this size, or not measured)."""
    pods = int(config["pods"])
    big, small = pods >= BIG, SMALL <= pods < BIG
    inc = modes.get("incremental") if isinstance(modes.get("incremental"), Mapping) else None
    out: list[dict[str, Any]] = []

    def num(*path: str) -> Any:
        return _get(inc, "phases", *path)

    per_event = num("churn", "cpu_per_event_us", "total")
    out.append(
        _target(
            "CPU per pod event at 150k pods",
            "≤ 200 µs",
            per_event,
            per_event is not None and per_event <= 200,
            big,
        )
    )
    if compare is not None:
        base = _get(compare, "modes", "incremental", "phases", "churn", "cpu_per_event_us", "total")
        base_pods = _get(compare, "config", "pods")
        r = round(per_event / base, 2) if per_event and base else None
        out.append(
            _target(
                f"CPU per event here ÷ at {base_pods} pods",
                "≤ 1.3",
                r,
                r is not None and r <= 1.3,
                big,
                "against --compare FILE",
            )
        )
    full = ratio.get("churn_cpu_per_event")
    out.append(
        _target(
            "full-scan ÷ incremental CPU per event at 10k pods",
            "≥ 100",
            full,
            full is not None and full >= 100,
            small,
        )
    )
    cold = num("cold_start", "wall_seconds")
    out.append(_target("cold start at 150k pods", "≤ 10 s", cold, cold is not None and cold <= 10, big))
    p99 = num("churn", "leak_to_release_minus_grace", "p99")
    measured = "release"
    if p99 is None and not config.get("leader"):
        p99, measured = num("churn", "leak_to_decision_minus_grace", "p99"), "decision (no leader)"
    out.append(
        _target(
            "leak release p99 − grace",
            "≤ 2 s",
            p99,
            p99 is not None and p99 <= 2,
            True,
            f"leak → {measured}",
        )
    )
    per_node = num("node_loss", "per_node") or {}
    worst = max((v.get("all_released_seconds") or float("inf") for v in per_node.values()), default=None)
    note = f"{config.get('node_loss_pods')} pods a node, {len(per_node)} nodes at once"
    out.append(
        _target(
            "deleted node cleaned",
            "≤ 5 s",
            worst if worst != float("inf") else None,
            worst is not None and worst <= 5,
            bool(per_node) and bool(config.get("leader")),
            note,
        )
    )
    rss = _peak(inc, "watcher")
    out.append(
        _target("watcher peak RSS at 150k pods", "≤ 300 MiB", rss, rss is not None and rss <= 300, big)
    )
    redis_rss = _peak(inc, "redis")
    out.append(
        _target(
            "Redis peak RSS at 150k pods",
            "≤ 256 MiB",
            redis_rss,
            redis_rss is not None and redis_rss <= 256,
            big,
        )
    )
    violations = sum(len(m.get("violations") or []) for m in modes.values() if isinstance(m, Mapping))
    out.append(_target("IPs released while in use", "0", violations, violations == 0, True))
    return out


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
    ratio = ratios(modes)
    return {
        "schema": SCHEMA,
        "command": command,
        "machine": dict(machine),
        "config": dict(config),
        "modes": dict(modes),
        "ratios_full_scan_over_incremental": ratio,
        "targets": targets(config, modes, ratio, compare),
    }


def _fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.3g}{unit}" if abs(v) < 100 else f"{v:,.0f}{unit}"
    return f"{v:,}{unit}" if isinstance(v, int) else f"{v}{unit}"


def _phase_row(mode: str, name: str, p: Mapping[str, Any]) -> str:
    cpu, rss = p["cpu_seconds"], p["peak_rss_mib"]
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
        parts = ", ".join(
            f"{role} {_fmt(per.get(role))}" for role in ("watcher", "workers", "leader", "redis")
        )
        lines.append(
            f"{pad} churn net of idle: {_fmt(per['total'])} µs/event ({parts}), "
            f"{_fmt(net['redis_commands_per_event'])} cmd/event"
        )
    for key in ("leak_to_release_minus_grace", "leak_to_decision_minus_grace"):
        lat = churn.get(key)
        if lat:
            what = key.replace("_", " ")
            p50, p99 = _fmt(lat["p50"], " s"), _fmt(lat["p99"], " s")
            lines.append(f"{pad} {what}: p50 {p50}, p99 {p99} ({lat['count']} leaks)")
    nodes = _get(m, "phases", "node_loss", "per_node") or {}
    if nodes:
        done = ", ".join(f"{n} {_fmt(v.get('all_released_seconds'), ' s')}" for n, v in nodes.items())
        lines.append(f"{pad} lost nodes' IPs all released after: {done}")
    return lines


def table(report: Mapping[str, Any]) -> str:
    """A short plain-text summary: one line per mode and phase, the ratios, the targets."""
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
        lines += [_phase_row(mode, name, p) for name, p in m["phases"].items()]
        lines += _mode_notes(m)
        if m.get("error"):
            lines.append(f"{'':<12} failed: {m['error']}")
    ratio = report.get("ratios_full_scan_over_incremental") or {}
    if ratio:
        lines += ["", "full-scan ÷ incremental: " + ", ".join(f"{k} {_fmt(v)}×" for k, v in ratio.items())]
    lines += ["", "targets:"]
    for t in report["targets"]:
        mark = {True: "met   ", False: "MISSED", None: "n/a   "}[t["met"]]
        note = f" ({t['note']})" if t["note"] else ""
        lines.append(f"  {mark} {t['target']}: {_fmt(t['value'])} (want {t['want']}){note}")
    return "\n".join(lines)
