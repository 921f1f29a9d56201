"""`ipamgc bench --node-churn` and `--conflicts-seconds`: a small node churn and a conflicts phase against
the real processes, so that neither can rot: nodes are replaced and every deleted node's IPs, blocks and
affinities are freed; leaks on blocks the CNI keeps writing are all released, whatever conflicts it
costs; the report says so in its keys.  With `$IPAMGC_CALICO_KUBE_CONTROLLERS` set, the same for
Calico's binary (opt-in: the binary is the user's).  No timing thresholds: the figures are
docs/benchmarks.md's."""

from __future__ import annotations

import os
from typing import Any

import pytest
from click.testing import CliRunner

from lab.bench import BenchConfig, run_bench
from lab.bench.conflicts import HOT_NODES, LEAKS_PER_NODE
from lab.bench.run import leader_usable
from lab.cluster.nodechurn import PRESETS, NodeChurnPlan
from lab.commands.bench import bench

TINY = NodeChurnPlan(
    name="tiny",
    nodes=6,
    pods_per_node=4,
    replaced=4,
    period=3.0,
    abrupt=0.5,
    pool_blocks=16,
    not_ready_after=0.3,
    node_deleted_after=0.5,
    pod_gc_after=0.5,
    compression=1.0,
)


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    if not leader_usable():
        pytest.skip("the leader does not start here")
    modes = (
        ("incremental", "calico") if os.environ.get("IPAMGC_CALICO_KUBE_CONTROLLERS") else ("incremental",)
    )
    binary = os.environ.get("IPAMGC_CALICO_KUBE_CONTROLLERS")
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(PRESETS, "tiny", TINY)
        cfg = BenchConfig(
            nodes=TINY.nodes,
            pods_per_node=TINY.pods_per_node,
            idle_seconds=0,
            churn_seconds=0,
            node_loss=0,
            node_churn="tiny",
            node_churn_periods=1,
            conflicts_seconds=1,  # at least grace + 10 s
            grace=0.5,
            batch_wait=0.2,
            kick_interval=0.3,
            workers=1,
            pod_size="small",
            modes=modes,
            calico_binaries=(("calico", binary),) if binary else (),
            timeout=60,
            seed=3,
        )
        return run_bench(cfg)


def test_every_deleted_node_is_freed_and_the_report_says_how_fast(report: dict[str, Any]) -> None:
    assert report["config"]["node_churn"] == "tiny"
    for name, mode in report["modes"].items():
        assert "error" not in mode, mode["error"]
        assert mode["violations"] == [], name
        assert mode["timeouts"] == [], name
        assert list(mode["phases"]) in (
            ["cold_start", "conflicts", "node_churn"],  # ipamgc's one run
            ["cold_start", "node_churn", "conflicts"],  # Calico's: the conflicts in its short-grace run
        )
        phase = mode["phases"]["node_churn"]
        work = phase["workload"]
        assert work["joined"] == work["nodes_deleted"] == TINY.replaced == phase["events"]
        assert work["drained"] + work["abrupt"] == TINY.replaced and work["errors"] == 0
        assert phase["nodes_deleted"] == TINY.replaced
        assert phase["all_freed"] is True
        assert phase["never_freed"] == {"nodes": 0, "ips": 0, "blocks": 0, "affinities": 0}
        freed = phase["freed_after_deletion_seconds"]
        assert freed["all"]["count"] == TINY.replaced
        assert freed["all_drained"]["count"] + freed["all_abrupt"]["count"] == TINY.replaced
        for what in ("ips", "blocks", "affinities"):
            assert 0 <= freed[what]["p50"] <= freed[what]["max"] <= freed["all"]["max"]
        # An abrupt node's pods outlive its Node object by the pod GC's delay: none is freed sooner.
        if freed["all_abrupt"]["count"]:
            assert freed["all_abrupt"]["p50"] >= TINY.pod_gc_after
        held = phase["held_by_deleted_nodes"]
        assert held["end"] == {"blocks": 0, "affinities": 0, "ips": 0}
        assert held["peak"]["blocks"] >= 1 and held["series"]
        assert phase["cni"] == {"borrowed_ips": 0, "refused_assignments": 0}
        assert phase["plan"]["name"] == "tiny" and phase["cpu_seconds"]["total"] > 0


def test_leaks_on_blocks_the_cni_writes_are_all_released(report: dict[str, Any]) -> None:
    for name, mode in report["modes"].items():
        phase = mode["phases"]["conflicts"]
        assert phase["leaks"] == HOT_NODES * LEAKS_PER_NODE == phase["events"], name
        assert phase["leak_to_release_minus_grace"]["unreleased"] == 0, name
        assert phase["leak_to_release_minus_grace"]["count"] == phase["leaks"]
        assert phase["cni_errors"] == 0 and phase["cni_pod_events"] > 0
        assert len(phase["hot_nodes"]) == HOT_NODES
        # Releasing 100 leaks takes writes to their blocks (conflicts among them, as they come).
        assert phase["collector_block_writes"] >= 1
        assert 0 <= phase["collector_block_conflicts"] <= phase["collector_block_writes"]
        assert mode["violations"] == []
    hot = {tuple(m["phases"]["conflicts"]["hot_nodes"]) for m in report["modes"].values()}
    assert len(hot) == 1  # every collector gets the same nodes


def test_an_unknown_preset_is_one_line_and_exit_2() -> None:
    result = CliRunner().invoke(bench, ["--node-churn", "karpenter", "--quiet"])
    assert result.exit_code == 2
    assert "karpenter" in result.output and "Traceback" not in result.output


def test_a_preset_brings_its_small_pool() -> None:
    cfg = BenchConfig(node_churn="7839")
    assert cfg.pools() == [("10.64.0.0/17", 26)]  # 512 blocks of /26
    assert BenchConfig().pools() is None
    with pytest.raises(ValueError, match="node_churn must be one of"):
        BenchConfig(node_churn="nope")
