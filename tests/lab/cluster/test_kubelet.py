"""The simulated kubelets: a Ready node's kubelet confirms a graceful pod deletion after its delay (CNI DEL,
then the grace-0 DELETE: a clean deletion in the ground truth); a NotReady or lost node's pods stay
Terminating, and the pod GC that removes them later makes their IPs leaks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import kubernetes.client as k8s
import orjson
import pytest
from kubernetes.client.exceptions import ApiException

from lab.apiserver.apiserver import SimApiServer
from lab.apiserver.store import SimApiError, Store
from lab.cluster.cluster import SimCluster, pod_name
from lab.cluster.kubelet import Kubelets
from lab.commands.sim import load_snapshot
from shared.blockops import ip_of
from tests.polling import wait_until


class FakeClock:
    """The kubelets' clock: time moves only when the test says."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def sim() -> SimCluster:
    cluster = SimCluster(Store(seed=4), seed=4, pools=[("10.0.0.0/22", 26), ("fd00::/116", 122)])
    cluster.add_node("node-a")
    cluster.add_node("node-b")
    return cluster


def _gone(store: Store, ns: str, pod: str) -> bool:
    try:
        store.get("pods", ns, pod)
    except SimApiError as exc:
        assert exc.code == 404
        return True
    return False


def _allocated(sim: SimCluster) -> set[str]:
    """Every IP an IPAMBlock holds for a handle, as the CNI wrote them."""
    ips = set()
    for block in sim.store.list("ipamblocks")["items"]:
        spec = block["spec"]
        for ordinal, idx in enumerate(spec["allocations"]):
            if idx is not None and spec["attributes"][idx].get("handle_id"):
                ips.add(ip_of(spec, ordinal))
    return ips


def test_a_graceful_delete_on_a_ready_node_goes_after_the_delay_with_its_ips_released(
    sim: SimCluster,
) -> None:
    clock = FakeClock()
    kubelets = Kubelets(sim, delay=1.0, clock=clock)
    ips = sim.create_pod("ns", "web", "node-a", dual_stack=True)
    events: list[tuple[str, str]] = []
    sim.store.add_hook(
        lambda plural, event, old, new: events.append((plural, event)) if plural == "pods" else None
    )

    sim.store.delete("pods", "ns", "web")  # kubectl delete pod: graceful, 30 s
    assert sim.store.get("pods", "ns", "web")["metadata"]["deletionTimestamp"]
    assert kubelets.next_due() == 1001.0
    clock.t = 1000.9
    assert kubelets.step() == 0  # the containers are still stopping
    assert not _gone(sim.store, "ns", "web")

    clock.t = 1001.0
    assert kubelets.step() == 1
    assert _gone(sim.store, "ns", "web")
    assert events == [("pods", "MODIFIED"), ("pods", "MODIFIED"), ("pods", "DELETED")]  # DELETE, then grace 0
    assert not set(ips) & _allocated(sim)  # CNI DEL released them
    assert all(sim.truth.usages[ip][-1].freed_by == "cni" for ip in ips)
    assert not set(ips) & (sim.truth.leaked_ips() | sim.truth.in_use_ips())
    assert sim.truth.violations == []
    assert ("ns", "web") not in sim.pod_handles
    assert kubelets.pending() == 0 and kubelets.next_due() is None
    kubelets.close()


def test_the_confirmation_comes_at_the_grace_period_when_that_is_shorter(sim: SimCluster) -> None:
    clock = FakeClock()
    kubelets = Kubelets(sim, delay=5.0, clock=clock)
    sim.create_pod("ns", "web", "node-a")
    sim.store.delete("pods", "ns", "web")  # 30 s: due after the delay
    assert kubelets.next_due() == 1005.0
    clock.t = 1001.0
    sim.store.delete("pods", "ns", "web", grace_period_seconds=2)  # asked again, shorter
    assert kubelets.next_due() == 1003.0
    assert kubelets.step(1002.9) == 0
    assert kubelets.step(1003.0) == 1
    assert _gone(sim.store, "ns", "web")
    kubelets.close()


def test_a_not_ready_nodes_pod_stays_terminating_until_the_node_is_back(sim: SimCluster) -> None:
    clock = FakeClock()
    kubelets = Kubelets(sim, delay=0.0, clock=clock)
    ips = sim.create_pod("ns", "web", "node-a")
    sim.set_node_ready("node-a", False)
    sim.store.delete("pods", "ns", "web")
    clock.t += 3600
    assert kubelets.step() == 0
    assert sim.store.get("pods", "ns", "web")["metadata"]["deletionTimestamp"]  # Terminating
    assert set(ips) <= sim.truth.in_use_ips()  # its containers may still run: nothing freed
    assert kubelets.pending() == 1 and kubelets.next_due() is None  # parked, no wake-up due

    sim.set_node_ready("node-a", True)  # the kubelet is back from its partition
    assert kubelets.next_due() == clock.t
    assert kubelets.step() == 1
    assert _gone(sim.store, "ns", "web")
    assert not set(ips) & (sim.truth.leaked_ips() | sim.truth.in_use_ips())
    kubelets.close()


def test_a_lost_nodes_pods_stay_terminating_and_leak_when_the_pod_gc_removes_them(sim: SimCluster) -> None:
    clock = FakeClock()
    kubelets = Kubelets(sim, delay=1.0, clock=clock)
    ips = sim.create_pod("ns", "web", "node-a")
    kept = sim.create_pod("ns", "api", "node-b")
    sim.store.delete("pods", "ns", "web")
    sim.delete_node("node-a")  # the machine vanishes before its kubelet confirmed
    clock.t += 3600
    assert kubelets.step() == 0
    assert sim.store.get("pods", "ns", "web")["metadata"]["deletionTimestamp"]  # Terminating
    assert kubelets.pending() == 0  # nothing waits for a node that is gone

    assert sim.remove_pods_of_node("node-a") == [("ns", "web")]  # the pod GC, without CNI DEL
    assert _gone(sim.store, "ns", "web")
    assert set(ips) <= sim.truth.leaked_ips()
    assert set(ips) <= _allocated(sim)  # still held in IPAM: the leak a collector must release
    assert set(kept) <= sim.truth.in_use_ips()
    kubelets.close()


def test_the_clusters_own_deletions_are_not_confirmed_twice(sim: SimCluster) -> None:
    clock = FakeClock()
    kubelets = Kubelets(sim, delay=1.0, clock=clock)
    ips = sim.create_pod("ns", "web", "node-a")
    sim.delete_pod("ns", "web")  # DELETE, CNI DEL, grace 0, all in one call
    assert kubelets.pending() == 0
    clock.t += 10
    assert kubelets.step() == 0
    assert kubelets.errors == 0
    assert all(sim.truth.usages[ip][-1].freed_by == "cni" for ip in ips)
    assert sim.truth.violations == []
    kubelets.close()


def test_a_pod_with_the_same_name_made_again_is_not_confirmed_for_the_old_one(sim: SimCluster) -> None:
    clock = FakeClock()
    kubelets = Kubelets(sim, delay=1.0, clock=clock)
    sim.create_pod("ns", "web", "node-a")
    sim.store.delete("pods", "ns", "web")
    sim.store.delete("pods", "ns", "web", grace_period_seconds=0)  # forced by hand
    sim.create_pod("ns", "web", "node-b")  # a new pod of that name
    clock.t += 10
    assert kubelets.step() == 0
    assert not sim.store.get("pods", "ns", "web")["metadata"].get("deletionTimestamp")
    kubelets.close()


def test_pods_already_terminating_when_the_kubelets_start_are_confirmed(sim: SimCluster) -> None:
    sim.create_pod("ns", "web", "node-a")
    sim.store.delete("pods", "ns", "web")
    clock = FakeClock()
    kubelets = Kubelets(sim, delay=1.0, clock=clock)
    assert kubelets.step(clock.t + 1.0) == 1
    assert _gone(sim.store, "ns", "web")
    kubelets.close()


def test_a_loaded_snapshots_pod_is_released_by_the_handle_its_allocations_name(tmp_path: Path) -> None:
    """`sim serve --snapshot`: the simulator did not start the snapshot's pods, so their kubelet finds the
    handle to CNI DEL in the IPAMBlocks (the allocations holding the pod's reported IPs and naming it)."""
    source = SimCluster(Store(seed=5), seed=5)
    source.add_node("node-a")
    ips = source.create_pod("ns", "web", "node-a", dual_stack=True)
    kept = source.create_pod("ns", "api", "node-a")
    snapshot = tmp_path / "snapshot.json"
    snapshot.write_bytes(orjson.dumps(source.export()))
    store = Store(seed=5)
    assert load_snapshot(store, str(snapshot)) > 0
    served = SimCluster(store, seed=5)
    assert set(ips) | set(kept) <= _allocated(served)
    clock = FakeClock()
    kubelets = Kubelets(served, delay=1.0, clock=clock)
    store.delete("pods", "ns", "web")
    assert kubelets.step(clock.t + 1.0) == 1
    assert _gone(store, "ns", "web")
    assert not set(ips) & _allocated(served)  # released by its handle, no leak made
    assert set(kept) <= _allocated(served)
    handles = {h["spec"]["handleID"] for h in store.list("ipamhandles")["items"]}
    assert source.pod_handles[("ns", "web")][0] not in handles  # its IPAMHandle went with its last IP
    assert source.pod_handles[("ns", "api")][0] in handles
    kubelets.close()


def test_closed_kubelets_confirm_nothing_and_a_negative_delay_is_refused(sim: SimCluster) -> None:
    with pytest.raises(ValueError, match="0 or more"):
        Kubelets(sim, delay=-1.0)
    clock = FakeClock()
    kubelets = Kubelets(sim, delay=0.0, clock=clock)
    kubelets.close()  # off: today's behaviour, a pod deleted gracefully stays Terminating
    sim.create_pod("ns", "web", "node-a")
    sim.store.delete("pods", "ns", "web")
    assert kubelets.step() == 0
    assert sim.store.get("pods", "ns", "web")["metadata"]["deletionTimestamp"]


def test_the_kubernetes_clients_delete_returns_and_the_pod_is_gone(sim: SimCluster) -> None:
    """As a new user tries it: `delete_namespaced_pod` against the simulated server answers at once with the
    pod Terminating, and the kubelets' thread confirms it about a second later."""
    ips = sim.create_pod("ns", "web", "node-a")
    with SimApiServer(sim.store) as server, Kubelets(sim) as kubelets, server.api_client() as api:
        core = k8s.CoreV1Api(api)
        answer = core.delete_namespaced_pod("web", "ns")
        assert answer.metadata is not None and answer.metadata.deletion_timestamp is not None  # Terminating

        def gone() -> bool:
            try:
                core.read_namespaced_pod("web", "ns")
            except ApiException as exc:
                assert exc.status == 404
                return True
            return False

        wait_until(gone, timeout=15.0, what="the pod confirmed by its kubelet")
        assert kubelets.confirmed == 1
    assert not set(ips) & (sim.truth.leaked_ips() | sim.truth.in_use_ips() | _allocated(sim))
    assert sim.truth.violations == []


def test_kubectl_delete_against_sim_serve_returns_and_the_pod_goes() -> None:
    """`ipamgc sim serve --kubelet-delay`: a pod deleted as kubectl does (graceful) goes within a deadline."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ipamgc", "sim", "serve", "--nodes", "2", "--pods-per-node", "2",
         "--kubelet-delay", "0.2", "--duration", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        config = k8s.Configuration()
        config.host = proc.stdout.readline().decode().strip()
        assert config.host.startswith("http://127.0.0.1:")
        ns, name = "ns-0", pod_name(0)  # the generated cluster's first pod
        with k8s.ApiClient(config) as api:
            core = k8s.CoreV1Api(api)
            answer = core.delete_namespaced_pod(name, ns)
            assert (
                answer.metadata is not None and answer.metadata.deletion_timestamp is not None
            )  # Terminating

            def gone() -> bool:
                return all(
                    p.metadata is None or p.metadata.name != name for p in core.list_namespaced_pod(ns).items
                )

            wait_until(gone, timeout=15.0, what="the pod confirmed by its kubelet")
    finally:
        proc.terminate()
        proc.communicate(timeout=10)
    assert proc.returncode == 0
