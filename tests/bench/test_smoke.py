"""A small run of `ipamgc bench`, both modes, so that the benchmark cannot rot: the real processes start,
every phase completes, and the report has its shape and sane values.  No timing thresholds here: the
performance claims live in `ipamgc bench` and docs/benchmarks.md, not in tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from ipamgc.bench.measure import percentiles
from ipamgc.bench.report import targets
from ipamgc.bench.run import leader_usable
from ipamgc.commands.bench import bench

NODES, PODS_PER_NODE = 20, 10
CHURN_RATE, CHURN_SECONDS = 40, 2
ROLES = {"watcher", "workers", "leader", "redis", "total"}


@pytest.fixture(scope="module")
def leader() -> bool:
    return leader_usable()


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory, leader: bool) -> tuple[dict[str, Any], str]:
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    args = [
        *("--nodes", str(NODES), "--pods-per-node", str(PODS_PER_NODE)),
        *("--churn-rate", str(CHURN_RATE), "--churn-seconds", str(CHURN_SECONDS), "--leak-rate", "0.5"),
        *("--idle-seconds", "0.5", "--node-loss", "1", "--node-loss-pods", "12"),
        *("--grace", "500ms", "--kick-interval", "300ms", "--batch-wait", "200ms", "--workers", "1"),
        *("--timeout", "60s", "--seed", "3", "--quiet", "--output", str(out)),
        "--leader" if leader else "--no-leader",
    ]
    result = CliRunner().invoke(bench, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return orjson.loads(Path(out).read_bytes()), result.output


def test_both_modes_run_every_phase(report: tuple[dict[str, Any], str], leader: bool) -> None:
    doc, table = report
    assert doc["schema"] == "ipamgc-bench/1"
    assert doc["config"]["pods"] == NODES * PODS_PER_NODE
    assert doc["config"]["leader"] is leader
    assert set(doc["modes"]) == {"incremental", "full-scan"}
    for name, mode in doc["modes"].items():
        assert "error" not in mode, mode["error"]
        assert mode["timeouts"] == [], name
        assert mode["violations"] == [], name
        assert list(mode["phases"]) == ["cold_start", "idle", "churn", "node_loss"]
        assert mode["cluster"]["allocations"] == NODES * PODS_PER_NODE + NODES  # pods + tunnel IPs
        for phase in mode["phases"].values():
            assert set(phase["cpu_seconds"]) == ROLES
            assert all(v >= 0 for v in phase["cpu_seconds"].values())
            assert phase["wall_seconds"] > 0
            assert phase["redis_commands"] >= 0
            assert set(phase["peak_rss_mib"]) == ROLES - {"total"}
            assert all(v > 0 for v in phase["peak_rss_mib"].values())
        cold = mode["phases"]["cold_start"]
        assert cold["events"] == cold["allocations"] == mode["cluster"]["allocations"]
        assert cold["cpu_seconds"]["watcher"] > 0 and cold["redis_commands"] > 0
        churn = mode["phases"]["churn"]
        assert (
            churn["events"]
            == CHURN_RATE * CHURN_SECONDS
            == churn["created"] + churn["deleted"] + churn["leaked"]
        )
        assert churn["errors"] == 0
        assert churn["leaks"] == churn["leaked"] > 0
        assert churn["cpu_per_event_us"]["total"] > 0 and churn["redis_commands_per_event"] > 0
        assert set(churn["net_of_idle"]["cpu_per_event_us"]) == ROLES
        decided = churn["leak_to_decision_minus_grace"]
        assert (decided["count"], decided["undecided"]) == (churn["leaks"], 0)
        lost = mode["phases"]["node_loss"]
        (node,) = lost["nodes"]
        assert lost["per_node"][node]["ips"] == lost["events"] == 13  # 12 pods and the tunnel IP
        if leader:
            released = churn["leak_to_release_minus_grace"]
            assert (released["count"], released["unreleased"]) == (churn["leaks"], 0)
            assert released["p50"] <= released["p99"] <= released["max"]
            assert lost["per_node"][node]["released"] == 13
            assert lost["affinities_gone_seconds"] is not None
    assert set(doc["ratios_full_scan_over_incremental"]) >= {
        "churn_cpu_per_event",
        "churn_redis_commands_per_event",
    }
    assert doc["ratios_full_scan_over_incremental"]["churn_cpu_per_event"] > 0
    assert {t["target"] for t in doc["targets"]} >= {"IPs released while in use", "leak release p99 − grace"}
    assert "targets:" in table and "full-scan" in table


def test_percentiles_use_the_nearest_rank() -> None:
    assert percentiles([]) == {"count": 0, "p50": None, "p99": None, "max": None}
    values = [float(i) for i in range(1, 101)]
    assert percentiles(values) == {"count": 100, "p50": 50.0, "p99": 99.0, "max": 100.0}


def test_targets_are_judged_only_where_they_apply() -> None:
    config = {"pods": 10_000, "leader": True, "node_loss_pods": 110}
    phases = {"churn": {"cpu_per_event_us": {"total": 150.0}, "leak_to_release_minus_grace": {"p99": 1.5}}}
    judged = {t["target"]: t["met"] for t in targets(config, {"incremental": {"phases": phases}}, {})}
    assert judged["CPU per pod event at 150k pods"] is None  # stated for 150,000 pods
    assert judged["leak release p99 − grace"] is True
    assert judged["full-scan ÷ incremental CPU per event at 10k pods"] is None  # full-scan not run
