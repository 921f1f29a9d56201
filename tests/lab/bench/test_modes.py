"""The benchmark's modes without running one: `--mode` parsing, the environment each mode gives each
process, the ratios of both baselines over incremental, issue 11's targets and the table with three modes.
(The smoke test runs them for real.)"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from lab.bench.config import MODES, BenchConfig, mode_env, parse_modes
from lab.bench.procs import Fleet, peak_rss_all, process_env
from lab.bench.report import build, ratios, table, targets
from lab.commands.bench import bench
from tests.polling import wait_until

# -- --mode --------------------------------------------------------------------------------------------------


def test_all_is_the_default_and_runs_the_three_modes_in_order() -> None:
    assert MODES == ("incremental", "per-node", "full-scan", "combined")
    assert BenchConfig().modes == ("incremental", "per-node", "full-scan")
    assert parse_modes("all") == ("incremental", "per-node", "full-scan")  # combined is asked for by name
    assert parse_modes("combined,incremental") == ("combined", "incremental")


def test_both_stays_an_alias_of_incremental_and_full_scan() -> None:
    assert parse_modes("both") == ("incremental", "full-scan")


def test_a_list_keeps_its_order_and_each_mode_once() -> None:
    assert parse_modes("per-node") == ("per-node",)
    assert parse_modes("incremental,per-node") == ("incremental", "per-node")
    assert parse_modes(" full-scan , incremental ") == ("full-scan", "incremental")
    assert parse_modes("incremental,both,all") == ("incremental", "full-scan", "per-node")


@pytest.mark.parametrize("text", ["", "fast", "incremental,", "per_node", "incremental,,full-scan"])
def test_an_unknown_mode_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="unknown mode"):
        parse_modes(text)


def test_combined_without_the_leader_is_refused() -> None:
    with pytest.raises(ValueError, match="combined runs the leader"):
        BenchConfig(modes=("combined",), leader=False)
    done = CliRunner().invoke(bench, ["--mode", "incremental,combined", "--no-leader", "--quiet"])
    assert done.exit_code == 2 and "combined runs the leader" in done.output


def test_bench_config_refuses_unknown_or_repeated_modes() -> None:
    for modes in [(), ("per-node", "per-node"), ("both",)]:
        with pytest.raises(ValueError, match="modes must be"):
            BenchConfig(modes=modes)


def test_the_command_line_refuses_an_unknown_mode_before_running_anything() -> None:
    result = CliRunner().invoke(bench, ["--mode", "incremental,per-nod", "--no-leader"])
    assert result.exit_code == 2
    assert "Invalid value for '--mode'" in result.output and "unknown mode 'per-nod'" in result.output


def test_help_describes_the_three_modes() -> None:
    text = CliRunner().invoke(bench, ["--help"]).output
    for word in ("incremental", "per-node", "full-scan", "all", "both", "IPAMGC_PER_NODE=1"):
        assert word in text


# -- the environment of each process -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "watcher", "workers"),
    [
        ("incremental", ("0", "0"), ("0", "0")),
        ("per-node", ("0", "1"), ("0", "1")),
        ("full-scan", ("1", "0"), ("0", "0")),
    ],
)
def test_each_mode_sets_its_flags_and_clears_the_other(
    mode: str, watcher: tuple[str, str], workers: tuple[str, str]
) -> None:
    for role, want in [("watcher", watcher), ("workers", workers), ("leader", ("0", "0"))]:
        env = mode_env(mode, role)
        assert (env["IPAMGC_FULL_SCAN"], env["IPAMGC_PER_NODE"]) == want, (mode, role)
        assert set(env) == {"IPAMGC_FULL_SCAN", "IPAMGC_PER_NODE"}


def test_mode_env_refuses_an_unknown_mode() -> None:
    with pytest.raises(ValueError, match="unknown mode"):
        mode_env("both", "watcher")


def test_the_fleet_overrides_a_flag_inherited_from_the_shell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IPAMGC_PER_NODE", "1")  # e.g. left over in the operator's shell
    script = "import signal; signal.pause()"  # waits for the SIGTERM of the fleet's close
    with Fleet(tmp_path) as fleet:
        proc = fleet.start("w", "workers", [sys.executable, "-c", script], mode_env("incremental", "workers"))

        def flags() -> Any:  # once exec'd: until then /proc shows this process's environment
            exec_d = "signal.pause" in Path(f"/proc/{proc.pid}/cmdline").read_text(errors="replace")
            return process_env(proc.pid) if exec_d else None

        env = wait_until(flags, timeout=10, what="the child to exec")
        assert (env["IPAMGC_PER_NODE"], env["IPAMGC_FULL_SCAN"]) == ("0", "0")
    assert process_env(proc.pid) == {}  # reaped: nothing to read


# -- ratios --------------------------------------------------------------------------------------------------


def _mode(per_event: float, commands: float, workers: float = 1.0, node_loss: float = 2.0) -> dict[str, Any]:
    return {
        "phases": {
            "churn": {
                "cpu_per_event_us": {"total": per_event},
                "net_of_idle": {"cpu_per_event_us": {"total": per_event / 2}, "redis_commands_per_event": 1},
                "redis_commands_per_event": commands,
                "cpu_seconds": {"workers": workers, "redis": 0.5},
            },
            "node_loss": {"cpu_seconds": {"total": node_loss}},
        }
    }


def test_the_memory_ratio_is_over_each_modes_run_wide_sum() -> None:
    modes = {
        "incremental": {**_mode(400, 8, 1.0, 2.0), "peak_rss_mib_all": {"sum": 234.2, "by_process": {}}},
        "combined": {**_mode(420, 8, 1.0, 2.0), "peak_rss_mib_all": {"sum": 98.8, "by_process": {}}},
        "calico": {**_mode(4000, 0, 5.0, 1.0), "peak_rss_mib_all": {"sum": 176.4, "by_process": {}}},
    }
    assert ratios(modes, "calico", "combined")["peak_rss_all"] == 1.79
    assert ratios(modes, "combined")["peak_rss_all"] == 0.42


def test_ratios_of_both_baselines_have_the_same_keys() -> None:
    modes = {
        "incremental": _mode(400, 8, 1.0, 2.0),
        "per-node": _mode(1600, 40, 3.0, 2.0),
        "full-scan": _mode(8000, 160, 10.0, 4.0),
    }
    full, per_node = ratios(modes), ratios(modes, "per-node")
    assert ratios(modes, "full-scan", "incremental") == full
    assert (
        set(full)
        == set(per_node)
        == {
            "churn_cpu_per_event",
            "churn_cpu_per_event_net_of_idle",
            "churn_redis_commands_per_event",
            "churn_workers_cpu",
            "churn_redis_cpu",
            "node_loss_cpu",
            "idle_cpu_per_second",
            "cold_start_cpu",
            "peak_rss_all",
        }
    )
    assert full["churn_cpu_per_event"] == 20.0 and per_node["churn_cpu_per_event"] == 4.0
    assert full["peak_rss_all"] is None  # no run-wide memory in these modes
    assert per_node["churn_redis_commands_per_event"] == 5.0 and per_node["node_loss_cpu"] == 1.0


def test_a_baseline_not_run_or_skipped_has_no_ratios() -> None:
    inc = _mode(400, 8)
    assert ratios({"incremental": inc}, "per-node") == {}
    assert ratios({"incremental": inc, "full-scan": {"skipped": "too big"}}) == {}
    assert ratios({"per-node": _mode(1, 1)}, "per-node") == {}
    doc = build({"pods": 10}, {"incremental": inc, "per-node": _mode(800, 8)}, {}, "ipamgc bench")
    assert doc["ratios_full_scan_over_incremental"] == {}
    assert doc["ratios_per_node_over_incremental"]["churn_cpu_per_event"] == 2.0


# -- targets -------------------------------------------------------------------------------------------------

SMALL_ONLY = {
    "CPU per pod event at 10k pods",
    "Redis commands per pod event at 10k pods",
    "full-scan ÷ incremental CPU per event at 10k pods",
    "per-node ÷ incremental CPU per event at 10k pods",
    "idle CPU per second at 10k pods",
}
BIG_ONLY = {
    "CPU per pod event at 150k pods",
    "per-node ÷ incremental CPU per event at 150k pods",
    "cold start at 150k pods",
    "watcher peak RSS at 150k pods",
    "Redis peak RSS at 150k pods",
}
EVERYWHERE = {"leak release p99 − grace", "every leak released", "IPs released while in use"}


def _inc(
    per_event: float = 400.0,
    commands: float = 6.0,
    idle: float = 0.004,
    cold: float = 12.0,
    rss: tuple[float, float] = (240.0, 190.0),
    p99: float = 1.5,
    unreleased: int = 0,
    node_released: float = 4.0,
) -> dict[str, Any]:
    watcher, redis = rss
    return {
        "phases": {
            "cold_start": {"wall_seconds": cold, "peak_rss_mib": {"watcher": watcher, "redis": redis}},
            "idle": {"cpu_per_second": {"total": idle}},
            "churn": {
                "cpu_per_event_us": {"total": per_event},
                "redis_commands_per_event": commands,
                "leak_to_release_minus_grace": {"p99": p99, "unreleased": unreleased},
                "leak_to_decision_minus_grace": {"p99": p99 / 2, "undecided": 0},
            },
            "node_loss": {"per_node": {"n1": {"all_released_seconds": node_released}}},
        },
        "violations": [],
    }


def _judged(pods: int, modes: dict[str, Any], leader: bool = True) -> dict[str, dict[str, Any]]:
    config = {"pods": pods, "leader": leader, "node_loss_pods": 110}
    return {t["target"]: t for t in targets(config, modes, ratios(modes))}


@pytest.mark.parametrize(("pods", "applies"), [(200, set()), (10_000, SMALL_ONLY), (150_000, BIG_ONLY)])
def test_each_target_applies_at_its_size_only(pods: int, applies: set[str]) -> None:
    judged = _judged(pods, {"incremental": _inc()})
    assert set(judged) == SMALL_ONLY | BIG_ONLY | EVERYWHERE | {"deleted node cleaned"}
    for name, t in judged.items():
        assert set(t) == {"target", "want", "value", "met", "applies_here", "note"}
        assert t["applies_here"] is (name in applies | EVERYWHERE | {"deleted node cleaned"}), name
        if not t["applies_here"]:
            assert t["met"] is None, name  # reported, not judged


def test_targets_at_10k_met_and_missed() -> None:
    inc, per_node, full = _inc(), _mode(1200, 20), _mode(4000, 80)  # per-node 3×, full-scan 10×
    judged = _judged(10_000, {"incremental": inc, "per-node": per_node, "full-scan": full})
    for name in SMALL_ONLY | EVERYWHERE | {"deleted node cleaned"}:
        assert judged[name]["met"] is True, name
    assert judged["idle CPU per second at 10k pods"]["value"] == 4.0  # ms
    assert judged["per-node ÷ incremental CPU per event at 10k pods"]["value"] == 3.0

    worse = _inc(per_event=600, commands=9, idle=0.006, p99=2.5, unreleased=1, node_released=6)
    judged = _judged(
        10_000, {"incremental": worse, "per-node": _mode(1200, 20), "full-scan": _mode(4000, 80)}
    )
    for name in SMALL_ONLY - {"per-node ÷ incremental CPU per event at 10k pods"} | EVERYWHERE:
        if name != "IPs released while in use":
            assert judged[name]["met"] is False, name
    assert judged["per-node ÷ incremental CPU per event at 10k pods"]["value"] == 2.0
    assert judged["per-node ÷ incremental CPU per event at 10k pods"]["met"] is False
    assert judged["deleted node cleaned"]["met"] is False


def test_targets_at_150k_met_and_missed() -> None:
    modes = {"incremental": _inc(per_event=400), "per-node": _mode(4000, 80)}
    judged = _judged(150_000, modes)
    for name in BIG_ONLY:
        assert judged[name]["met"] is True, name
    worse = _inc(per_event=501, cold=16, rss=(251, 201))
    judged = _judged(150_000, {"incremental": worse, "per-node": _mode(4000, 80)})
    for name in BIG_ONLY:
        assert judged[name]["met"] is False, name


def test_a_baseline_not_run_leaves_its_ratio_target_unjudged() -> None:
    judged = _judged(10_000, {"incremental": _inc()})
    for name in (
        "full-scan ÷ incremental CPU per event at 10k pods",
        "per-node ÷ incremental CPU per event at 10k pods",
    ):
        assert (judged[name]["value"], judged[name]["met"]) == (None, None)


def test_per_node_leaks_left_over_are_recorded_but_judge_only_incremental() -> None:
    late = _inc(unreleased=3)
    judged = _judged(10_000, {"incremental": _inc(), "per-node": late})
    released = judged["every leak released"]
    assert (released["value"], released["met"]) == (0, True)
    assert "per-node, which confirms late by design: 3" in released["note"]


def test_without_a_leader_leaks_are_judged_by_their_decision() -> None:
    inc = _inc(unreleased=2)  # no leader: leak_to_release is not measured, decisions are
    del inc["phases"]["churn"]["leak_to_release_minus_grace"]
    judged = _judged(1_000, {"incremental": inc}, leader=False)
    assert judged["every leak released"]["value"] == 0 and judged["every leak released"]["met"] is True
    assert judged["leak release p99 − grace"]["value"] == 0.75
    assert judged["deleted node cleaned"]["applies_here"] is False


def test_violations_in_any_mode_miss_the_target() -> None:
    per_node = {**_inc(), "violations": [{"ip": "10.0.0.1"}]}
    judged = _judged(10_000, {"incremental": _inc(), "per-node": per_node})
    assert (judged["IPs released while in use"]["value"], judged["IPs released while in use"]["met"]) == (
        1,
        False,
    )


def test_compare_file_still_judges_growth_at_150k() -> None:
    base = {"config": {"pods": 10_000}, "modes": {"incremental": _inc(per_event=400)}}
    config = {"pods": 150_000, "leader": True, "node_loss_pods": 110}
    modes = {"incremental": _inc(per_event=480)}
    judged = {t["target"]: t for t in targets(config, modes, {}, base)}
    t = judged["CPU per event here ÷ at 10000 pods"]
    assert (t["value"], t["met"], t["want"]) == (1.2, True, "≤ 1.3")


# -- the table -----------------------------------------------------------------------------------------------


def _phase(events: int) -> dict[str, Any]:
    return {
        "wall_seconds": 1.0,
        "cpu_seconds": {"total": 0.5, "watcher": 0.2, "workers": 0.2, "leader": 0.05, "redis": 0.05},
        "events": events,
        "cpu_per_event_us": {"total": 500_000 / max(events, 1)},
        "redis_commands_per_event": 5.0,
        "peak_rss_mib": {"watcher": 50.0, "redis": 10.0},
    }


def test_the_table_shows_three_modes_and_both_ratio_lines() -> None:
    config = {
        **BenchConfig(leader=True).as_dict(),
        "pods": 10_000,
    }
    modes: dict[str, Any] = {}
    for name, per_event in [("incremental", 400.0), ("per-node", 1600.0), ("full-scan", 8000.0)]:
        m = _mode(per_event, 8)
        churn = {**_phase(100), **m["phases"]["churn"], "cpu_seconds": _phase(100)["cpu_seconds"]}
        churn["leak_to_release_minus_grace"] = {
            "count": 4,
            "p50": 0.5,
            "p99": 1.0,
            "max": 1.0,
            "unreleased": 0,
        }
        if name == "per-node":
            churn["leak_to_release_minus_grace"].update(count=3, unreleased=1)
            churn["leak_wait_limit_seconds"] = 12.0
        modes[name] = {"phases": {"cold_start": _phase(10), "churn": churn}, "violations": []}
    text = table(build(config, modes, {}, "ipamgc bench"))
    rows = [line.split()[0] for line in text.splitlines() if line.split()[1:2] == ["churn"]]
    assert rows == ["incremental", "per-node", "full-scan"]
    assert "per-node ÷ incremental: churn_cpu_per_event 4×" in text
    assert "full-scan ÷ incremental: churn_cpu_per_event 20×" in text
    assert "(3 leaks, 1 not released)" in text
    assert "leaks waited for at most 12 s once nothing was pending" in text


def test_the_table_says_when_a_mode_was_skipped() -> None:
    config = {**BenchConfig().as_dict(), "pods": 200_000}
    modes = {"incremental": {"phases": {"churn": {**_phase(10)}}}, "full-scan": {"skipped": "too big"}}
    text = table(build(config, modes, {}, ""))
    assert "full-scan    too big" in text and "÷ incremental:" not in text


def test_a_modes_run_wide_memory_keeps_each_processs_highest_over_its_runs() -> None:
    mib = 1024 * 1024
    first = peak_rss_all({"kube-controllers": 1052 * mib})
    assert first == {"sum": 1052.0, "by_process": {"kube-controllers": 1052.0}}
    # Calico's latency run, after its cost run (a process of its own): the runs' larger sum, not both.
    both = peak_rss_all({"kube-controllers-latency": 1380 * mib}, first)
    assert both == {
        "sum": 1380.0,
        "by_process": {"kube-controllers": 1052.0, "kube-controllers-latency": 1380.0},
    }
    assert peak_rss_all({"kube-controllers": 900 * mib}, first)["sum"] == 1052.0
    assert peak_rss_all({"combined": 254 * mib, "redis": 181 * mib})["sum"] == 435.0
