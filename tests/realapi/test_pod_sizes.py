"""Real-size pods on a real kube-apiserver (issue 42): the actors' `real` and `large` pods pass its validation
and admission, it keeps its own managedFields from the field managers the actors name, and the collectors'
view of each pod is what the actors reported."""

from __future__ import annotations

import orjson
import pytest

from lab.cluster.cluster import SimCluster
from lab.cluster.podshape import PodSize
from lab.realapi import RealCluster
from shared.parse import parse_pod


@pytest.mark.parametrize("size", ["real", "large"])
def test_real_size_pods_on_a_real_server(real_v1: RealCluster, size: PodSize) -> None:
    store = real_v1.store()
    try:
        sim = SimCluster(store, seed=7, pod_size=size)  # type: ignore[arg-type]  (RestStore)
        sim.bootstrap(leak_grace_period="2s")
        sim.bulk_populate(2, 3, dual_stack_every=2)  # restored pods: POST, then the kubelet's /status
        sim.create_pod("ns-0", "churn-0000001", "node-00001")  # created Pending, then the status
        pods = store._request("GET", "/api/v1/pods")["items"]
        sizes = [len(orjson.dumps(p)) for p in pods]
        mean = sum(sizes) / len(sizes)
        print(f"{size}: {len(pods)} pods, mean {mean:.0f} JSON bytes as the server sends them")
        assert len(pods) == 7
        for pod in pods:
            meta = pod["metadata"]
            managers = {(m["manager"], m.get("subresource", "")) for m in meta["managedFields"]}
            assert managers == {("kube-controller-manager", ""), ("kubelet", "status")}, managers
            slim = parse_pod(pod)
            assert slim.phase == "Running"
            assert list(slim.pod_ips) == sim.pod_handles[slim.key][1]
            assert slim.annotations == {} and not slim.deletion_timestamp and not slim.host_network
            assert [r["kind"] for r in meta["ownerReferences"]] == ["ReplicaSet"]
            assert len(pod["status"]["containerStatuses"]) == len(pod["spec"]["containers"]) >= 2
    finally:
        store.close()
