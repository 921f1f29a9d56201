"""`ipamgc up` end to end: watcher, three workers and the leader as separate processes, real Redis, the
simulated cluster over HTTP, a one-second grace period, judged against the simulator's ground truth."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import redis

from ipamgc.sim.apiserver import SimApiServer
from ipamgc.sim.cluster import SimCluster
from shared.audit import audit
from shared.consistency import check_consistency
from shared.keys import STATE_SYNCED
from shared.rules import Release
from shared.snapshot import build_inventory
from tests.e2e.conftest import KEYS
from tests.polling import wait_until

GRACE = 1.0
ROOT = Path(__file__).resolve().parents[2]


def test_up_releases_every_injected_leak_and_nothing_in_use(
    server: SimApiServer, sim: SimCluster, client: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    sim.bootstrap("1s")
    sim.populate(nodes=6, pods_per_node=5)
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
    up = subprocess.Popen(
        [sys.executable, "-m", "ipamgc", "up", "--kubeconfig", str(kubeconfig), "--redis-url", redis_url,
         "--workers", "3", "--log-dir", str(tmp_path / "logs")],
        cwd=ROOT,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_until(lambda: client.hget(KEYS.state, STATE_SYNCED) == b"1", 30, what="the initial sync")
        # Leaks of every kind ...
        injected = set(sim.leak_pod_deleted_without_cni_del("ns-0", "pod-0000000"))
        injected |= set(sim.leak_pod_deleted_without_cni_del("ns-3", "pod-0000003"))
        injected |= set(sim.leak_ip_changed("ns-1", "pod-0000001"))
        injected |= set(sim.leak_terminal_pod("ns-2", "pod-0000002"))
        before = sim.truth.leaked_ips()
        sim.leak_node_deleted("node-00005")  # its five pods and its tunnel IP
        injected |= sim.truth.leaked_ips() - before
        # ... and the look-alikes that must be kept.
        sim.stale_node_attribute("default", "stale", "node-00001", attr_node="node-00002")
        sim.dual_stack_single_status("default", "dual", "node-00003")
        sim.windows_node("win-0")
        sim.create_pod("default", "late", "node-00004")
        assert sim.truth.leaked_ips() == injected
        assert len(injected) == 10  # four pod IPs, then node-00005: five pod IPs and its tunnel IP

        wait_until(lambda: not sim.truth.leaked_ips(), GRACE + 20, what="every leak to be released")
        latencies = sim.truth.release_latencies()
        assert len(latencies) == len(injected)
        # Released within the grace period plus a few seconds of detection and confirmation.
        assert max(latencies) <= GRACE + 8, latencies
        assert sim.truth.violations == []
        assert sim.truth.unexpected == []

        # The deleted node is cleaned up too: no block or affinity of node-00005 is left.
        def node_gone() -> bool:
            blocks = sim.store.list("ipamblocks")["items"]
            affinities = sim.store.list("blockaffinities")["items"]
            return not any(b["spec"].get("affinity") == "host:node-00005" for b in blocks) and not any(
                a["spec"]["node"] == "node-00005" for a in affinities
            )

        wait_until(node_gone, 15, what="node-00005's blocks and affinities to be released")
        inv = build_inventory(sim.export()["items"])
        report = audit(inv, GRACE)
        assert [r for r in report.rows if r.release is not Release.NEVER] == []
        # The one invalid allocation left is the dual-stack pod's unreported IPv6, held by its handle.
        invalid = [r.verdict.allocation for r in report.rows if not r.verdict.valid]
        assert [(a.attrs["pod"], ":" in a.ip) for a in invalid] == [("dual", True)]
        assert check_consistency(inv) == []
        assert sim.truth.violations == []
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(timeout=30)
    assert up.returncode == 0
