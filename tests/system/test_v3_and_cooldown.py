"""The whole system (`ipamgc up`: the watcher, workers and the leader as separate processes, real Redis)
against simulated clusters of Calico 3.33: one that serves Calico's objects in projectcalico.org/v3 only,
and one with an IP cooldown, judged against the simulator's ground truth and its request log.

On the v3 cluster nothing is configured: every component discovers the group as Calico does, and no
request goes to crd.projectcalico.org.  With a cooldown, each IP the leader releases is seen parked
(`releasedAt`, off the free list) and comes back to `unallocated` only once its cooldown is over, by the
leader's cold-IP pass (no CNI write touches the block meanwhile)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis

from lab.apiserver.apiserver import SimApiServer
from lab.apiserver.resources import resources_for
from lab.apiserver.store import Store
from lab.cluster.cluster import SimCluster
from shared.blockops import ip_of, released_at_seconds
from shared.calicogroup import V3
from shared.keys import STATE_IP_COOLDOWN, STATE_SYNCED
from shared.netaddr import cidr_to_name
from tests.fixtures.stack import KEYS, ROOT
from tests.polling import wait_until

GRACE = "1s"


@contextmanager
def up(server: SimApiServer, redis_url: str, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`ipamgc up --kubeconfig` on `server` with two workers, stopped with SIGTERM (exit 0 expected)."""
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
    env = {k: v for k, v in os.environ.items() if not k.endswith("CALICO_API_GROUP")}
    env["IPAMGC_RUNTIME_DIR"] = str(tmp_path / "runtime")
    with (tmp_path / "up.stderr").open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ipamgc", "up", "--kubeconfig", str(kubeconfig), "--redis-url", redis_url,
             "--workers", "2", "--log-dir", str(tmp_path / "logs"), "--metrics-port", "0"],
            cwd=ROOT, stderr=stderr, env=env,
        )  # fmt: skip
        try:
            yield proc
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    assert proc.returncode == 0, (tmp_path / "up.stderr").read_text()


def logs(tmp_path: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()}" for p in sorted((tmp_path / "logs").glob("*.log")))


def test_the_whole_system_works_on_a_cluster_with_only_projectcalico_org_v3(
    client: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    store = Store(resources_for(V3), seed=21)
    with SimApiServer(store, bookmark_interval=0.2) as server:
        sim = SimCluster(store, seed=21)
        sim.bootstrap(GRACE)
        sim.populate(nodes=4, pods_per_node=3)
        with up(server, redis_url, tmp_path):
            wait_until(lambda: client.hget(KEYS.state, STATE_SYNCED) == b"1", 30, what="the initial sync")
            injected = set(sim.leak_pod_deleted_without_cni_del("ns-0", "pod-0000000"))
            injected |= set(sim.leak_ip_changed("ns-4", "pod-0000004"))
            before = sim.truth.leaked_ips()
            sim.leak_node_deleted("node-00003")  # its three pods and its tunnel IP
            injected |= sim.truth.leaked_ips() - before
            sim.stale_node_attribute("default", "stale", "node-00001", attr_node="node-00002")  # kept
            sim.create_pod("default", "late", "node-00002")
            assert sim.truth.leaked_ips() == injected and len(injected) == 1 + 1 + 4

            wait_until(lambda: not sim.truth.leaked_ips(), 30, what=f"every leak released\n{logs(tmp_path)}")
            assert sim.truth.violations == [] and sim.truth.unexpected == []

            def node_gone() -> bool:
                affinities = store.list("blockaffinities")["items"]
                blocks = store.list("ipamblocks")["items"]
                return not any(a["spec"]["node"] == "node-00003" for a in affinities) and not any(
                    b["spec"].get("affinity") == "host:node-00003" for b in blocks
                )

            wait_until(node_gone, 20, what="node-00003's blocks and affinities released")
            assert client.hget(KEYS.state, STATE_IP_COOLDOWN) == b"0"  # IPAMConfiguration `default` followed
        # Every Calico request of every component went to projectcalico.org/v3, and the leader wrote there.
        calico = [
            r for r in server.requests if r.resource not in (None, "nodes", "pods", "leases", "namespaces")
        ]
        assert calico and {r.path.split("/")[2] for r in calico} == {"projectcalico.org"}
        writes = {(r.method, r.resource) for r in calico if r.method in ("PUT", "DELETE")}
        assert {("PUT", "ipamblocks"), ("DELETE", "blockaffinities"), ("PUT", "ipamhandles")} <= writes
        assert any(r.resource == "ipamconfigurations" and r.verb == "watch" for r in calico)
        # A v3 BlockAffinity's `deleted` stayed a boolean through every write (the CRD refuses a string).
        assert all(a["spec"]["deleted"] is False for a in store.list("blockaffinities")["items"])

        # `ipamgc check --kubeconfig` audits the same cluster, found the same way: nothing leaked is left.
        kubeconfig = str(tmp_path / "kubeconfig")
        done = subprocess.run(
            [sys.executable, "-m", "ipamgc", "check", "--kubeconfig", kubeconfig, "-o", "json"],
            cwd=ROOT, capture_output=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr.decode()
        summary = json.loads(done.stdout)["summary"]
        assert summary["leaked"] == 0 and summary["allocations"] == summary["in_use"] > 0


class Cooling:
    """Every parking and every return of an ordinal, from the store's commits (in commit order)."""

    def __init__(self) -> None:
        self.parked: dict[str, float] = {}  # ip → releasedAt (epoch s)
        self.returned: dict[str, tuple[float, float]] = {}  # ip → (releasedAt, returned at)
        self.lock = threading.Lock()

    def hook(
        self, plural: str, event: str, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None
    ) -> None:
        if plural != "ipamblocks" or new is None or event != "MODIFIED":
            return
        spec, before = new["spec"], (old or {}).get("spec") or {}
        attrs, old_attrs = spec.get("attributes") or [], before.get("attributes") or []
        free = set(spec.get("unallocated") or [])
        with self.lock:
            for ordinal, idx in enumerate(spec.get("allocations") or []):
                if idx is not None and "releasedAt" in attrs[idx]:
                    when = released_at_seconds(attrs[idx]["releasedAt"])
                    assert when is not None
                    self.parked[ip_of(spec, ordinal)] = when
            for ordinal, idx in enumerate(before.get("allocations") or []):
                if idx is not None and "releasedAt" in old_attrs[idx] and ordinal in free:
                    when = released_at_seconds(old_attrs[idx]["releasedAt"])
                    assert when is not None
                    self.returned[ip_of(spec, ordinal)] = (when, time.time())


def test_released_ips_cool_down_and_are_returned_only_after_the_cooldown(
    server: SimApiServer, sim: SimCluster, client: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    cooldown = 3
    cooling = Cooling()
    server.store.add_hook(cooling.hook)
    sim.bootstrap(GRACE)
    sim.set_ip_cooldown(cooldown)
    sim.populate(nodes=3, pods_per_node=3)
    with up(server, redis_url, tmp_path):
        wait_until(lambda: client.hget(KEYS.state, STATE_IP_COOLDOWN) == str(cooldown).encode(), 30)
        wait_until(lambda: client.hget(KEYS.state, STATE_SYNCED) == b"1", 30, what="the initial sync")
        # Leaks on node-00000 only; no pod is created there afterwards (no CNI write of its blocks).
        injected = set(sim.leak_pod_deleted_without_cni_del("ns-0", "pod-0000000"))
        injected |= set(sim.leak_pod_deleted_without_cni_del("ns-1", "pod-0000001"))
        wait_until(lambda: not sim.truth.leaked_ips(), 30, what=f"the leaks released\n{logs(tmp_path)}")
        # Each released IP was parked, not freed: never handed out while cooling.
        wait_until(lambda: injected <= set(cooling.parked), 10, what="the released IPs seen cooling")
        others = [sim.create_pod("default", f"new-{i}", "node-00001")[0] for i in range(3)]
        assert not injected & set(others)
        wait_until(lambda: injected <= set(cooling.returned), 30, what=f"their return\n{logs(tmp_path)}")
        for ip in injected:
            released_at, returned_at = cooling.returned[ip]
            assert returned_at >= released_at + cooldown, (ip, released_at, returned_at)
            assert cooling.parked[ip] == released_at
        assert sim.truth.violations == [] and sim.truth.unexpected == []
    # The return was the leader's conditional write (its cold-IP pass), once the cooldown was over: the
    # simulated CNI writes in-process, so every PUT of the request log is ipamgc's.
    (block,) = sim.cni.node_blocks("node-00000", 4)
    puts = [r.timestamp for r in server.requests if r.method == "PUT" and r.name == cidr_to_name(block)]
    blocks = [r for r in server.requests if r.method == "PUT" and r.resource == "ipamblocks"]
    assert blocks and all(r.user_agent.startswith("ipamgc-leader/") for r in blocks)
    earliest = min(cooling.parked[ip] for ip in injected)
    assert len(puts) >= 2 and max(puts) >= earliest + cooldown  # the release (parking), then the return
    items = server.store.list("ipamblocks")["items"]
    assert not any("releasedAt" in a for b in items for a in b["spec"].get("attributes") or [])


def test_up_runs_its_simulated_cluster_and_the_components_in_the_group_it_is_given(
    client: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.endswith("CALICO_API_GROUP")}
    env["IPAMGC_RUNTIME_DIR"] = str(tmp_path / "runtime")
    log_dir = tmp_path / "logs"
    with (tmp_path / "up.stderr").open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ipamgc", "up", "--calico-api-group", "projectcalico.org/v3",
             "--redis-url", redis_url, "--workers", "1", "--nodes", "2", "--pods-per-node", "2",
             "--log-dir", str(log_dir), "--metrics-port", "0"],
            cwd=ROOT, stderr=stderr, env=env,
        )  # fmt: skip
        try:
            wait_until(lambda: client.hget(KEYS.state, STATE_SYNCED) == b"1", 30, what="the initial sync")
            wait_until(lambda: client.hget(KEYS.state, STATE_IP_COOLDOWN) == b"0", 10, what="the cooldown")
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    assert proc.returncode == 0, (tmp_path / "up.stderr").read_text()
    watcher = (log_dir / "watcher.log").read_text()
    assert "Calico API group: projectcalico.org/v3 (configured)" in watcher
    assert "ipamgc sim: " in (log_dir / "sim.log").read_text()
