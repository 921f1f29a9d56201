"""A small run of `ipamgc bench --mode combined`, so that the one-process mode cannot rot: one `ipamgc
combined` process (and Redis) runs every phase, its CPU and peak RSS come under the role `combined`, and
the churn's leaks and the lost node's IPs are released by the leader inside it.  No timing thresholds."""

from __future__ import annotations

from pathlib import Path

import orjson
from click.testing import CliRunner

from lab.commands.bench import bench

NODES, PODS_PER_NODE = 10, 6
CHURN_RATE, CHURN_SECONDS = 20, 2
ROLES = {"combined", "redis"}


def test_combined_runs_every_phase_in_one_process(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    args = [
        *("--nodes", str(NODES), "--pods-per-node", str(PODS_PER_NODE), "--mode", "combined"),
        *("--churn", str(CHURN_RATE), "--churn-seconds", str(CHURN_SECONDS), "--leak-rate", "0.5"),
        *("--idle-seconds", "0.5", "--node-loss", "1", "--node-loss-pods", "8"),
        *("--leak-grace-period", "500ms", "--kick-interval", "300ms", "--batch-wait", "200ms"),
        *("--timeout", "60s", "--seed", "4", "--quiet", "--output-file", str(out)),
    ]
    result = CliRunner().invoke(bench, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    doc = orjson.loads(out.read_bytes())
    assert list(doc["modes"]) == ["combined"]
    mode = doc["modes"]["combined"]
    assert "error" not in mode, mode.get("error")
    assert (mode["timeouts"], mode["violations"]) == ([], [])
    assert set(mode["mode_flags"]) == {"combined"}  # one ipamgc process, incremental's flags
    assert mode["mode_flags"]["combined"] == {"IPAMGC_FULL_SCAN": "0", "IPAMGC_PER_NODE": "0"}
    assert list(mode["phases"]) == ["cold_start", "idle", "churn", "node_loss"]
    for phase in mode["phases"].values():
        assert set(phase["cpu_seconds"]) == ROLES | {"total"}
        assert set(phase["peak_rss_mib"]) == ROLES
        assert all(v > 0 for v in phase["peak_rss_mib"].values())
    cold = mode["phases"]["cold_start"]
    assert cold["events"] == mode["cluster"]["allocations"] and cold["cpu_seconds"]["combined"] > 0
    churn = mode["phases"]["churn"]
    released = churn["leak_to_release_minus_grace"]
    assert churn["leaks"] > 0 and (released["count"], released["unreleased"]) == (churn["leaks"], 0)
    lost = mode["phases"]["node_loss"]
    (node,) = lost["nodes"]
    assert lost["per_node"][node]["released"] == lost["events"] == 9  # 8 pods and the tunnel IP
    assert "in one" in result.output  # the table's row for the one process
    # The run's memory: each process's highest peak, by name, and their sum (two processes here).
    memory = mode["peak_rss_mib_all"]
    assert set(memory["by_process"]) == {"combined", "redis"}
    highest = {r: max(p["peak_rss_mib"][r] for p in mode["phases"].values()) for r in ROLES}
    assert memory["by_process"] == highest
    assert memory["sum"] == round(sum(highest.values()), 1)
    assert "peak RSS over the run, each process's highest summed: " in result.output
