"""ipamgc's watcher, workers and leader against a real kube-apiserver + etcd with Calico's v1 CRDs and
deploy/'s RBAC: the leaks the actors make are released, nothing in use is (ground truth)."""

from __future__ import annotations

import pytest

from lab.realapi import RealCluster
from tests.realapi.conftest import Components, actors
from tests.realapi.scenario import allocated_ips, judge, store_of, wait_released

pytestmark = pytest.mark.realapi


def test_pod_leaks_released_and_pods_in_use_kept(real_v1: RealCluster, components_v1: Components) -> None:
    with actors(real_v1) as sim:
        for node in ("node-a", "node-b"):
            sim.add_node(node)
        for i in range(8):
            sim.create_pod("apps", f"web-{i}", "node-a" if i % 2 else "node-b", dual_stack=i == 3)
        sim.stale_node_attribute("apps", "moved", "node-a", attr_node="node-b")  # not a leak (#12257)
        sim.dual_stack_single_status("apps", "half", "node-b")  # not a leak (#5044)
        components_v1.start()
        leaked = set(sim.leak_pod_deleted_without_cni_del("apps", "web-0"))
        leaked |= set(sim.leak_ip_changed("apps", "web-1"))
        leaked |= set(sim.leak_terminal_pod("apps", "web-2"))
        leaked |= set(sim.leak_pod_deleted_without_cni_del("apps", "web-3"))  # dual-stack: both IPs
        sim.delete_pod("apps", "web-4")  # a clean CNI DEL: not ipamgc's
        assert leaked <= allocated_ips(store_of(sim))
        wait_released(sim, leaked, alive=components_v1.alive)
        components_v1.alive()
        judge(sim)
        assert {u.ip for u in sim.truth.released_leaks()} == leaked
