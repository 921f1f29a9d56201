"""`ipamgc up` end to end: watcher, three workers and the leader as separate processes, real Redis, the
simulated cluster over HTTP, a one-second grace period, judged against the simulator's ground truth."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import redis

from lab.apiserver.apiserver import SimApiServer
from lab.cluster.cluster import SimCluster
from shared.audit import audit
from shared.consistency import check_consistency
from shared.keys import STATE_SYNCED
from shared.snapshot import build_inventory
from shared.verdicts import Release
from tests.fixtures.stack import KEYS
from tests.polling import wait_until

GRACE = 1.0
ROOT = Path(__file__).resolve().parents[2]


def free_port_run(n: int) -> int:
    """The first of `n` consecutive free ports (bound and released again, as up's pre-flight checks)."""
    for _ in range(50):
        first = random.randrange(20000, 60000 - n)
        socks = []
        try:
            for port in range(first, first + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("0.0.0.0", port))
            return first
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {n} consecutive free ports")


def metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


def served(port: int, needle: str) -> bool:
    try:
        return needle in metrics(port)
    except OSError:
        return False


def test_up_releases_every_injected_leak_and_nothing_in_use(
    server: SimApiServer, sim: SimCluster, client: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    sim.bootstrap("1s")
    sim.populate(nodes=6, pods_per_node=5)
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
    port = free_port_run(5)
    runtime = tmp_path / "runtime"  # where up announces its Redis to status and audit
    env = {k: v for k, v in os.environ.items() if k not in ("IPAMGC_REDIS_URL", "REDIS_URL")}
    env["IPAMGC_RUNTIME_DIR"] = str(runtime)
    stderr = (tmp_path / "up.stderr").open("w")
    up = subprocess.Popen(
        [sys.executable, "-m", "ipamgc", "up", "--kubeconfig", str(kubeconfig), "--redis-url", redis_url,
         "--workers", "3", "--log-dir", str(tmp_path / "logs"), "--metrics-port", str(port)],
        cwd=ROOT,
        stderr=stderr,
        env=env,
    )  # fmt: skip
    try:
        wait_until(lambda: client.hget(KEYS.state, STATE_SYNCED) == b"1", 30, what="the initial sync")
        # The watcher on --metrics-port with Calico's series, the others on the ports after it, as printed.
        wait_until(lambda: served(port, "ipam_allocations_in_use{"), 20, what="the watcher's Calico series")
        # Each component serves its metrics once it has started (on a loaded machine, after the watcher).
        for offset, component in ((1, "worker"), (2, "worker"), (3, "worker"), (4, "leader")):
            at, needle = port + offset, f'ipamgc_build_info{{component="{component}"'
            wait_until(lambda at=at, needle=needle: served(at, needle), 20, what=f"{component} metrics")
        start = (tmp_path / "up.stderr").read_text()
        assert (
            f"metrics: watcher 127.0.0.1:{port}, worker-0 127.0.0.1:{port + 1}, "
            f"worker-1 127.0.0.1:{port + 2}, worker-2 127.0.0.1:{port + 3}, leader 127.0.0.1:{port + 4}"
        ) in start
        assert f"IPAMGC_REDIS_URL={redis_url} ipamgc status" in start
        # status finds up's Redis with no URL given, and says so.
        st = subprocess.run(
            [sys.executable, "-m", "ipamgc", "status", "--output", "json"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
        assert (
            st.stderr.strip()
            == f"ipamgc status: Redis {redis_url} (the only running `ipamgc up`, pid {up.pid})"
        )
        assert json.loads(st.stdout)["synced"] is True
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

        # A release writes the block, then the handle's count (`workers/release.py`): the last handle may
        # still be on its way when the last block write made every leak count as released.
        def consistent() -> bool:
            return check_consistency(build_inventory(sim.export()["items"])) == []

        wait_until(consistent, 10, what="blocks, handles and affinities to agree")
        assert sim.truth.violations == []
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(timeout=30)
        stderr.close()
    assert up.returncode == 0
    assert list(runtime.glob("up-*.json")) == []  # withdrawn on the way out
