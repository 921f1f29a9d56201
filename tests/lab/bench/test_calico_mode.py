"""`ipamgc bench --mode calico`: Calico's own kube-controllers as a benchmark mode.

What a user relies on, without the binary (CI has none): the mode is skipped with one line saying how to
get one, a wrong path is one line and exit 2, the report carries `ratios_calico_over_incremental` with
the keys of the other ratios, and Calico's log is read as Calico writes it (lines from real runs of 3.26.1
and 3.33).  With `$IPAMGC_CALICO_KUBE_CONTROLLERS` set to a real binary, a small run of the mode itself
(opt-in: the binary is the user's, never the project's)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from lab.bench.config import BenchConfig, parse_modes
from lab.bench.report import RATIO_KEYS, build, ratios, table
from lab.commands.bench import bench
from lab.kubecontrollers import HOW_TO_GET, CalicoLog, environment, kcc_spec, parse_binaries

SMALL = [
    *("--nodes", "4", "--pods-per-node", "5", "--churn-rate", "20", "--churn-seconds", "2"),
    *("--idle-seconds", "0", "--node-loss", "1", "--node-loss-pods", "6", "--timeout", "60s", "--quiet"),
]


def _exe(path: Path) -> Path:
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_binaries_are_a_path_or_named_paths(tmp_path: Path) -> None:
    a, b = _exe(tmp_path / "kc-a"), _exe(tmp_path / "kc-b")
    (one,) = parse_binaries(str(a))
    assert (one.name, one.mode, one.path) == ("calico", "calico", a.resolve())
    two = parse_binaries(f"v3.33={a}, v3.26.1={b}")
    assert [(x.name, x.mode) for x in two] == [("v3.33", "calico-v3.33"), ("v3.26.1", "calico-v3.26.1")]
    assert parse_binaries(None) == () and parse_binaries("  ") == ()
    not_exec = tmp_path / "plain"
    not_exec.write_text("")
    for bad, why in [
        (str(tmp_path / "missing"), "no such file"),
        (str(not_exec), "not executable"),
        (f"{a},{b}", "NAME=PATH"),
        (f"x={a},x={b}", "a name of its own"),
        (f"bad name={a}", "letters, digits"),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_binaries(bad)


def test_calico_is_a_mode_but_not_part_of_all() -> None:
    assert parse_modes("incremental,calico") == ("incremental", "calico")
    assert "calico" not in parse_modes("all")
    BenchConfig(modes=("calico",))  # valid without binaries: the run skips it with a line
    with pytest.raises(ValueError, match="calico_grace"):
        BenchConfig(modes=("calico",), calico_grace=0)


def test_without_a_binary_the_mode_is_skipped_with_how_to_get_one(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    # None removes it: CliRunner's env only overrides (the opt-in run below sets it in the shell)
    result = CliRunner(env={"IPAMGC_CALICO_KUBE_CONTROLLERS": None}).invoke(
        bench, [*SMALL, "--mode", "calico", "--output", str(out)], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    doc = orjson.loads(out.read_bytes())
    assert doc["modes"] == {"calico": {"skipped": HOW_TO_GET}}
    assert doc[RATIO_KEYS["calico"]] == {}
    assert "/usr/bin/kube-controllers" in HOW_TO_GET and "--calico-kube-controllers" in HOW_TO_GET


def test_a_wrong_binary_is_one_line_and_exit_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        bench, [*SMALL, "--mode", "calico", "--calico-kube-controllers", str(tmp_path / "nope")]
    )
    assert result.exit_code == 2
    assert "no such file" in result.output and "Traceback" not in result.output


def _mode(per_event: float, node_loss: float, *, calico: bool = False) -> dict[str, Any]:
    roles = (
        {"kube-controllers": 1.0} if calico else {"watcher": 0.5, "workers": 0.3, "leader": 0.1, "redis": 0.1}
    )
    phase = {
        "wall_seconds": 10.0,
        "cpu_seconds": {**roles, "total": 1.0},
        "peak_rss_mib": dict.fromkeys(roles, 50.0),
        "events": 100,
        "cpu_per_event_us": {"total": per_event},
        "net_of_idle": {"cpu_per_event_us": {"total": per_event / 2}, "redis_commands_per_event": 0.0},
        "redis_commands_per_event": 0.0 if calico else 5.0,
    }
    return {
        "phases": {
            "cold_start": {**phase, "cpu_seconds": {**roles, "total": 2.0}},
            "idle": {**phase, "events": 0, "cpu_per_second": {"total": 0.001 if calico else 0.003}},
            "churn": phase,
            "node_loss": {**phase, "cpu_seconds": {**roles, "total": node_loss}},
        }
    }


def test_calico_ratios_have_the_keys_of_the_other_ratios() -> None:
    modes = {
        "incremental": _mode(400, 1.0),
        "full-scan": _mode(4000, 2.0),
        "calico-v3.33": _mode(200, 0.5, calico=True),
        "calico-v3.26.1": _mode(8000, 4.0, calico=True),
    }
    doc = build({"pods": 10_000, "node_loss": 2, "node_loss_pods": 110}, modes, {}, "ipamgc bench")
    first = doc[RATIO_KEYS["calico"]]
    assert set(first) == set(doc[RATIO_KEYS["full-scan"]]) == set(ratios(modes))
    # Calico cheaper than ipamgc here: the ratio says so (< 1), nothing rounds it away
    assert first["churn_cpu_per_event"] == 0.5 and first["node_loss_cpu"] == 0.5
    # no workers, no Redis in Calico's process: those ratios are None, not 0
    assert first["churn_redis_commands_per_event"] is None and first["churn_workers_cpu"] is None
    assert doc["ratios_calico_over_incremental_by_mode"]["calico-v3.26.1"]["churn_cpu_per_event"] == 20.0
    text = table({**doc, "config": {**doc["config"], **_TABLE_CONFIG}})
    assert "calico-v3.33 ÷ incremental: churn_cpu_per_event 0.5×" in text
    assert "one Go process" in text


_TABLE_CONFIG = {
    "nodes": 200,
    "churn_rate": 50.0,
    "churn_seconds": 20.0,
    "leak_rate": 0.05,
    "node_loss": 2,
    "node_loss_pods": 110,
    "grace": 2.0,
    "workers": 2,
    "shards": 4,
    "leader": True,
}

# Lines as Calico's kube-controllers logged them on the simulated cluster (3.33, then 3.26.1).
_K = "kube-controllers/"
_LEAK = 'handle="k8s-pod-network.0439" ip="10.64.0.2" node="node-00000" pod="ns-1/pod-0000001"'
LOG = "\n".join(
    [
        f"2026-12-04 10:14:11.134 [INFO][25622] {_K}ipam.go 452: Syncer is InSync, kicking sync channel "
        "status=in-sync",
        f"2026-12-04 10:14:16.181 [INFO][25622] {_K}ipam_allocation.go 184: Candidate IP leak {_LEAK}",
        f"2026-12-04 10:14:26.259 [WARNING][25622] {_K}ipam_allocation.go 205: Confirmed IP leak after "
        f"10.078091859s {_LEAK}",
        f"2026-12-04 10:14:26.277 [INFO][25622] {_K}ipam.go 1381: Successfully garbage collected leaked IP "
        f"address {_LEAK}",
        "2026-12-04 10:17:45.954 [INFO][1759] ipam_allocation.go 175: Candidate IP leak "
        'handle="k8s-pod-network.4609" ip="10.64.0.69" node="node-00001"',
        "2026-12-04 10:15:59.291 [WARNING][30887] main.go 518: configuration changed; restarting",
        "",
    ]
).encode()


def test_calicos_log_is_read_as_calico_writes_it(tmp_path: Path) -> None:
    path = tmp_path / "kc.log"
    path.write_bytes(LOG[:200])  # a partial line is not read until it is whole
    log = CalicoLog(path)
    assert [e.kind for e in log.poll()] == ["in-sync"]
    path.write_bytes(LOG)
    assert [e.kind for e in log.poll()] == ["candidate", "confirmed", "released", "candidate", "restarting"]
    assert log.ips("candidate") == {"10.64.0.2", "10.64.0.69"}
    assert log.ips("released") == {"10.64.0.2"}
    assert log.count("restarting") == 1
    (released,) = [e for e in log.events if e.kind == "released"]
    assert released.fields["pod"] == "ns-1/pod-0000001" and released.fields["node"] == "node-00000"


def test_kube_controllers_runs_as_a_calico_cluster_runs_it(tmp_path: Path) -> None:
    env = environment(tmp_path / "kubeconfig")
    assert env["ENABLED_CONTROLLERS"] == "node" and env["DATASTORE_TYPE"] == "kubernetes"
    assert env["CALICO_KUBE_CONTROLLERS_INNER"] == "1"
    spec = kcc_spec("15m0s", debug_profile_port=6060)
    assert spec["controllers"]["node"]["leakGracePeriod"] == "15m0s"
    assert spec["controllers"]["migration"] == {"policyNameMigrator": "Disabled"}
    assert spec["prometheusMetricsPort"] == 0 and spec["debugProfilePort"] == 6060


@pytest.mark.skipif(
    not os.environ.get("IPAMGC_CALICO_KUBE_CONTROLLERS"),
    reason="opt-in: set IPAMGC_CALICO_KUBE_CONTROLLERS to Calico's kube-controllers binary",
)
def test_the_real_binary_on_a_small_cluster(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    args = [*SMALL, "--mode", "calico", "--leak-rate", "0.5", "--output", str(out)]
    args += ["--calico-leak-grace-period", "10m", "--grace", "2s"]
    result = CliRunner().invoke(bench, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    doc = orjson.loads(out.read_bytes())
    (mode,) = doc["modes"].values()
    assert "error" not in mode and mode["timeouts"] == [] and mode["violations"] == []
    assert list(mode["phases"]) == ["cold_start", "churn", "node_loss", "churn_short_grace"]
    churn = mode["phases"]["churn"]
    assert churn["candidates_logged"] == churn["leaks"]
    assert churn["leak_to_release_minus_grace"]["unreleased"] == 0
    assert mode["phases"]["node_loss"]["leak_to_release_minus_grace"]["unreleased"] == 0
