"""`ipamgc bench --kube-apiserver`: a small run against the real kube-apiserver + etcd (a cluster of its
own, started by the bench), so the benchmark's real-server backend keeps working: the cluster built
through the REST actors, the phases measured, the collector's API requests counted from the audit log,
every leak released and no IP in use released."""

from __future__ import annotations

from pathlib import Path

import orjson
from click.testing import CliRunner

from lab.commands.bench import bench
from lab.realapi import binaries


def test_a_small_benchmark_on_the_real_server(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    args = ["--nodes", "4", "--pods-per-node", "5", "--churn-rate", "10", "--churn-seconds", "3"]
    args += [
        "--idle-seconds",
        "1",
        "--node-loss",
        "1",
        "--node-loss-pods",
        "6",
        "--timeout",
        "90s",
        "--quiet",
    ]
    args += ["--leak-rate", "0.5", "--mode", "incremental", "--output-file", str(out)]
    args += ["--kube-apiserver", str(binaries().parent)]
    result = CliRunner().invoke(bench, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    doc = orjson.loads(out.read_bytes())
    mode = doc["modes"]["incremental"]
    assert "error" not in mode and mode["timeouts"] == [] and mode["violations"] == []
    assert mode["cluster"]["api_server"] == "kube-apiserver" and mode["cluster"]["pods"] == 20
    phases = mode["phases"]
    assert phases["cold_start"]["api_requests"]["by_verb"].get("list pods", 0) >= 1  # the watcher's list
    assert phases["churn"]["events"] > 0
    assert phases["churn"]["leak_to_release_minus_grace"]["unreleased"] == 0
    assert phases["node_loss"]["leak_to_release_minus_grace"]["unreleased"] == 0
    assert doc["config"]["kube_apiserver"] == str(binaries().parent)
