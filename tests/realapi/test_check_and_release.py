"""`ipamgc check --kubeconfig` (as a user bound to deploy/'s read-only `ipamgc-check` ClusterRole) and
`ipamgc release --from-report` (with the leader's ServiceAccount) on a real kube-apiserver: the report
finds exactly the actors' leaks, the release frees exactly the `now` ones, nothing in use."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab.realapi import RealCluster
from tests.realapi.conftest import actors, run_cli
from tests.realapi.scenario import allocated_ips, judge, store_of, wait_released

pytestmark = pytest.mark.realapi


def test_check_reports_the_leaks_and_release_from_report_frees_the_confirmed_ones(
    real_v1: RealCluster, redis_url: str, tmp_path: Path
) -> None:
    with actors(real_v1) as sim:
        for node in ("node-a", "node-b", "node-dead"):
            sim.add_node(node)
        for i in range(6):
            sim.create_pod("apps", f"p-{i}", ("node-a", "node-b", "node-dead")[i % 3])
        candidate = set(sim.leak_pod_deleted_without_cni_del("apps", "p-0"))  # live node: after-grace
        before = sim.truth.leaked_ips()
        sim.leak_node_deleted("node-dead")
        confirmed = sim.truth.leaked_ips() - before  # deleted node: now

        done = run_cli(real_v1, "check", "check", "--output", "json")
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        by_release: dict[str, set[str]] = {}
        for a in report["allocations"]:
            if not a["valid"]:
                by_release.setdefault(a["release"], set()).add(a["ip"])
        assert by_release.get("now", set()) == confirmed
        assert by_release.get("after-grace", set()) == candidate
        assert report["summary"]["in_use"] == len(sim.truth.in_use_ips())
        path = tmp_path / "report.json"
        path.write_text(done.stdout)

        dry = run_cli(real_v1, "release", "release", "--from-report", str(path), "--dry-run",
                      "--redis-url", redis_url, "--output", "json")  # fmt: skip
        assert dry.returncode == 0, dry.stderr
        assert confirmed <= allocated_ips(store_of(sim))  # a dry run writes nothing

        done = run_cli(real_v1, "release", "release", "--from-report", str(path),
                       "--redis-url", redis_url, "--output", "json")  # fmt: skip
        assert done.returncode == 0, done.stderr + done.stdout
        wait_released(sim, confirmed, timeout=30)
        assert candidate <= allocated_ips(store_of(sim))  # not `now`: left to the running system
        judge(sim)
