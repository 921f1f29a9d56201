"""Churn keeps the population and leaks what it says; `ipamgc sim serve` serves a cluster the client reads."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from lab.apiserver.store import Store
from lab.cluster.churn import Churn
from lab.cluster.cluster import SimCluster
from shared.audit import audit
from shared.consistency import check_consistency
from shared.snapshot import build_inventory
from shared.verdicts import Release


def test_churn_is_seeded_and_its_leaks_are_exactly_the_leaks() -> None:
    def run() -> tuple[int, list[str], set[str]]:
        sim = SimCluster(Store(seed=1), seed=1, pools=[("10.0.0.0/20", 26)])
        sim.bulk_populate(8, 10)
        churn = Churn(sim, rate=1e9, leak_rate=0.2, seed=3)
        for _ in range(400):
            churn.step()
        assert churn.stats.errors == 0
        assert 60 <= sim.pod_count() <= 100
        inv = build_inventory(sim.export()["items"])
        report = audit(inv, 900.0)
        leaked = {r.verdict.allocation.ip for r in report.rows if r.release is not Release.NEVER}
        assert leaked == set(churn.stats.leaked_ips) == sim.truth.leaked_ips()
        assert check_consistency(inv) == []
        assert sim.truth.violations == []
        return churn.stats.events, churn.stats.leaked_ips, leaked

    assert run() == run()


def test_bulk_population_matches_the_cni_path() -> None:
    slow = SimCluster(Store(seed=0), seed=0, pools=[("10.0.0.0/20", 26)])
    slow.populate(3, 5)
    fast = SimCluster(Store(seed=0), seed=0, pools=[("10.0.0.0/20", 26)])
    fast.bulk_populate(3, 5)
    for sim in (slow, fast):
        inv = build_inventory(sim.export()["items"])
        assert check_consistency(inv) == []
        assert audit(inv, 900.0).summary == {
            "allocations": 18,
            "in_use": 18,
            "leaked": 0,
            "release_now": 0,
            "release_after_grace": 0,
        }
    # After a bulk load the CNI keeps allocating from the loaded blocks.
    fast.create_pod("ns-x", "after-bulk", "node-00001")
    assert check_consistency(build_inventory(fast.export()["items"])) == []


def test_sim_serve_prints_its_url_and_serves_the_cluster(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    proc = subprocess.Popen(
        [sys.executable, "-m", "ipamgc", "sim", "serve", "--nodes", "3", "--pods-per-node", "4",
         "--kubeconfig-out", str(kubeconfig), "--duration", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().decode().strip()
        assert url.startswith("http://127.0.0.1:")
        assert kubeconfig.exists(), "the kubeconfig is written before the URL is printed"
        api = k8s_config.new_client_from_config(str(kubeconfig))
        with api:
            core = k8s.CoreV1Api(api)
            pods = orjson.loads(core.list_pod_for_all_namespaces(_preload_content=False).data)
            assert len(pods["items"]) == 12
            crd = k8s.CustomObjectsApi(api)
            kcc = crd.get_cluster_custom_object(
                "crd.projectcalico.org", "v1", "kubecontrollersconfigurations", "default"
            )
            assert kcc["spec"]["controllers"]["node"]["leakGracePeriod"] == "15m0s"
    finally:
        proc.terminate()
        proc.communicate(timeout=10)


def test_export_of_a_served_snapshot_audits_like_the_snapshot(tmp_path: Path) -> None:
    """`sim serve --snapshot` → `sim export` → `check` gives the same verdicts as `check` on the file,
    and `check --kubeconfig` on the live server too."""
    from click.testing import CliRunner

    from ipamgc.cli import cli
    from lab.apiserver.apiserver import SimApiServer
    from lab.commands.sim import load_snapshot

    store = Store(seed=0)
    assert load_snapshot(store, "examples/leaks.json") > 0
    with SimApiServer(store) as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        runner = CliRunner()
        exported = tmp_path / "export.json"
        result = runner.invoke(
            cli, ["sim", "export", "--kubeconfig", str(kubeconfig), "--output-file", str(exported)]
        )
        assert result.exit_code == 0, result.output
        live = runner.invoke(cli, ["check", "--kubeconfig", str(kubeconfig), "-o", "json"])
        assert live.exit_code == 0, live.output
    original = runner.invoke(cli, ["check", "--snapshot", "examples/leaks.json", "-o", "json"])
    again = runner.invoke(cli, ["check", "--snapshot", str(exported), "-o", "json"])
    docs = [orjson.loads(r.stdout) for r in (again, original, live)]
    assert [d.pop("report")["source"] for d in docs] == ["snapshot", "snapshot", "live"]
    assert "collecting" in docs[2].pop("calico_collector")  # live only: Calico's collector's state
    assert docs[0] == docs[1] == docs[2]  # the same verdicts
    assert docs[1]["summary"]["leaked"] == 7


def test_churn_schedules_pods_on_live_nodes_only() -> None:
    """A lost node gets no new pods (a scheduler's view), so none are started there behind the truth."""
    sim = SimCluster(Store(seed=2), seed=2, pools=[("10.0.0.0/20", 26)])
    sim.bulk_populate(4, 2)
    churn = Churn(sim, rate=1e9, leak_rate=0.0, seed=5)
    lost = sorted(sim.node_names)[-1]
    sim.leak_node_deleted(lost)
    for _ in range(200):
        churn.step()
    assert churn.stats.errors == 0
    assert all(node != lost for node in sim.pod_nodes.values())


def test_a_pod_removed_with_its_lost_node_is_a_leak_even_if_it_started_there_after() -> None:
    """The pod GC of a lost node removes every pod object on it without CNI DEL: each one's IPs are leaks
    from then on in the truth, also for a pod that started on the node after the node's own bookkeeping
    (the demo once judged such an IP `released while in use`)."""
    sim = SimCluster(Store(seed=3), seed=3, pools=[("10.0.0.0/20", 26)])
    sim.add_node("node-a")
    sim.add_node("node-b")
    sim.delete_node("node-a")
    late = sim.create_pod("ns", "late", "node-a")  # raced the node's loss
    assert set(late) <= sim.truth.in_use_ips()
    sim.remove_pods_of_node("node-a")
    assert set(late) <= sim.truth.leaked_ips()
    assert not set(late) & sim.truth.in_use_ips()
