"""Fixtures of the `realapi` tier: a real kube-apiserver + etcd (lab/realapi.py) per Calico API
group, wiped between tests; ipamgc's components as processes, each under its own identity; the
simulated cluster's actors writing through `RestStore`; the session's real Redis (`redis_url`,
tests/fixtures/redis.py).

Selected with `-m realapi` only (pyproject's addopts deselect it).  Once selected, a binary that cannot
be built or a server that does not start is a failure with one line, never a skip.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from lab.cluster.cluster import SimCluster
from lab.cluster.restapi import RestStore
from lab.realapi import ROOT, HarnessError, RealCluster
from lab.realapi_pki import NAMESPACE
from shared.calicogroup import V1, V3
from tests.polling import wait_until

GRACE = "2s"  # the leak grace period the tests' KubeControllersConfiguration sets


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.realapi)


_clusters: dict[str, RealCluster] = {}


def _cluster(group_name: str) -> RealCluster:
    cluster = _clusters.get(group_name)
    if cluster is None:
        workdir = Path(tempfile.mkdtemp(prefix=f"ipamgc-realapi-{group_name}-"))
        try:
            cluster = RealCluster(workdir, V3 if group_name == "v3" else V1)
        except HarnessError as exc:
            pytest.fail(f"realapi: {exc}", pytrace=False)
        try:
            cluster.start()
        except HarnessError as exc:
            cluster.stop()
            pytest.fail(f"realapi: {exc}", pytrace=False)
        _clusters[group_name] = cluster
    return cluster


@pytest.fixture(scope="session", autouse=True)
def _stop_clusters() -> Iterator[None]:
    try:
        yield
    finally:
        for cluster in _clusters.values():
            cluster.stop()


def wipe(cluster: RealCluster) -> None:
    """Every object the previous test's actors and ipamgc made: pods, nodes, namespaces of pods, Calico's
    IPAM objects and config, KubeVirt's objects, the components' Leases."""
    store = cluster.store()
    try:
        calico = cluster.group
        for plural in ("ipamblocks", "ipamhandles", "blockaffinities", "ipamconfigs",
                       "kubecontrollersconfigurations", "clusterinformations", "ippools"):  # fmt: skip
            store._request("DELETE", f"/apis/{calico.api_version}/{calico.plural(plural)}")
        # A namespaced resource's collection is deleted per namespace (no cluster-wide DELETE route).
        now = {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0}
        for prefix, plural in (("/apis/kubevirt.io/v1", "virtualmachineinstances"),
                               ("/apis/kubevirt.io/v1", "virtualmachines"), ("/api/v1", "pods")):  # fmt: skip
            items = store._request("GET", f"{prefix}/{plural}")["items"]
            for ns in {o["metadata"]["namespace"] for o in items}:
                store._request("DELETE", f"{prefix}/namespaces/{ns}/{plural}", now)
        store._request("DELETE", "/api/v1/nodes")
        store._request("DELETE", f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases")

        def empty() -> bool:
            return (
                not store._request("GET", "/api/v1/pods")["items"] and not store.list("ipamblocks")["items"]
            )

        wait_until(empty, timeout=30, what="the cluster wiped")
    finally:
        store.close()


@pytest.fixture
def real_v1() -> RealCluster:
    cluster = _cluster("v1")
    wipe(cluster)
    return cluster


@pytest.fixture
def real_v3() -> RealCluster:
    cluster = _cluster("v3")
    wipe(cluster)
    return cluster


@contextlib.contextmanager
def actors(cluster: RealCluster, seed: int = 7, grace: str | None = GRACE) -> Iterator[SimCluster]:
    """The simulated cluster's actors (nodes, pods, CNI, node loss, pod GC) on the real server, with the
    cluster-scoped Calico objects every cluster has; their ground truth in `.truth`."""
    store = cluster.store()
    try:
        sim = SimCluster(store, seed=seed)  # type: ignore[arg-type]  (RestStore: the Store verbs over REST)
        sim.bootstrap(leak_grace_period=grace)
        yield sim
    finally:
        store.close()


def settle(sim: SimCluster) -> None:
    store = sim.store
    assert isinstance(store, RestStore)
    store.settle()


FAST_ENV = {
    "IPAMGC_KICK_INTERVAL": "0.1",
    "IPAMGC_BATCH_WAIT": "0.01",
    "IPAMGC_RESYNC_PERIOD": "3600",
    "IPAMGC_BACKOFF_BASE": "0.05",
    "IPAMGC_BACKOFF_MAX": "0.5",
    "IPAMGC_ELECTION_LEASE": "4",
    "IPAMGC_ELECTION_RENEW": "3",
    "IPAMGC_ELECTION_RETRY": "1",
    "IPAMGC_WORK_LEASE": "2",
    "IPAMGC_JOB_IDLE": "0.5",
    "IPAMGC_WATCH_TIMEOUT": "30",
}


@dataclass
class Components:
    """`ipamgc watch`, `work` and `lead` as processes: the watcher and the leader each with the kubeconfig
    of its ServiceAccount, the worker with none (deploy/ mounts it no token)."""

    cluster: RealCluster
    redis_url: str
    workdir: Path
    extra_env: dict[str, str] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("IPAMGC_", "KUBECONFIG"))}
        env.update(FAST_ENV, IPAMGC_REDIS_URL=self.redis_url, PYTHONUNBUFFERED="1")
        env["IPAMGC_CALICO_API_GROUP"] = self.cluster.group.api_version
        env.update(self.extra_env)
        return env

    def argv(self, name: str) -> list[str]:
        base = [sys.executable, "-m", "ipamgc"]
        lease = ["--lease-namespace", NAMESPACE]
        if name == "watch":
            return [*base, "watch", "--kubeconfig", str(self.cluster.kubeconfig("watcher")), *lease,
                    "--metrics-port", str(self.metrics_port)]  # fmt: skip
        if name == "lead":
            return [*base, "lead", "--kubeconfig", str(self.cluster.kubeconfig("leader")), *lease,
                    "--rate-limit", "0", "--metrics-port", "0"]  # fmt: skip
        return [*base, "work", "--metrics-port", "0"]

    metrics_port: int = 0

    def start(self, *names: str) -> None:
        from lab.realapi import free_port

        if not self.metrics_port:
            self.metrics_port = free_port()
        for name in names or ("watch", "work", "lead"):
            log = (self.workdir / f"{name}.log").open("ab")
            self.procs[name] = subprocess.Popen(
                self.argv(name), env=self.env(), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
            log.close()

    def alive(self) -> None:
        for name, p in self.procs.items():
            if p.poll() is not None:
                pytest.fail(f"ipamgc {name} exited {p.returncode}: {self.tail(name)}", pytrace=False)

    def tail(self, name: str, lines: int = 5) -> str:
        text = (self.workdir / f"{name}.log").read_text(errors="replace").strip().splitlines()
        return " | ".join(text[-lines:])

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for name, p in self.procs.items():
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
                print(f"ipamgc {name} did not stop on SIGTERM: killed")


@pytest.fixture
def components_v1(real_v1: RealCluster, redis_url: str, tmp_path: Path) -> Iterator[Components]:
    c = Components(real_v1, redis_url, tmp_path)
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def components_v3(real_v3: RealCluster, redis_url: str, tmp_path: Path) -> Iterator[Components]:
    c = Components(real_v3, redis_url, tmp_path)
    try:
        yield c
    finally:
        c.stop()


def run_cli(
    cluster: RealCluster, who: str, *args: str, env: dict[str, Any] | None = None
) -> subprocess.CompletedProcess[str]:
    """One `ipamgc` command under identity `who` (its kubeconfig), as a user would run it."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("IPAMGC_")}
    full_env["IPAMGC_CALICO_API_GROUP"] = cluster.group.api_version
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "ipamgc", *args, "--kubeconfig", str(cluster.kubeconfig(who))],
        env=full_env, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
