"""Deleted-node cleanup, empty blocks, the IP cooldown and KubeVirt VMs on a real kube-apiserver with
Calico's v1 CRDs (and the KubeVirt test CRDs), judged against the actors' ground truth."""

from __future__ import annotations

import pytest

from lab.cluster.kubevirt import KubeVirt
from lab.realapi import RealCluster
from shared.netaddr import cidr_to_name
from tests.polling import wait_until
from tests.realapi.conftest import Components, actors
from tests.realapi.scenario import allocated_ips, judge, store_of, wait_released
from tests.system.test_v3_and_cooldown import Cooling

pytestmark = pytest.mark.realapi


def node_gone(sim_store: object, node: str) -> bool:
    from lab.cluster.restapi import RestStore

    assert isinstance(sim_store, RestStore)
    affinities = sim_store.list("blockaffinities")["items"]
    blocks = sim_store.list("ipamblocks")["items"]
    handles = sim_store.list("ipamhandles")["items"]
    return (
        not any(a["spec"]["node"] == node for a in affinities)
        and not any(b["spec"].get("affinity") == f"host:{node}" for b in blocks)
        and not any(h["spec"]["handleID"].endswith(f"-{node}") for h in handles)  # its tunnel handle
    )


def test_a_deleted_nodes_ips_blocks_and_affinities_are_released(
    real_v1: RealCluster, components_v1: Components
) -> None:
    with actors(real_v1) as sim:
        for node in ("node-a", "node-b", "node-dead"):
            sim.add_node(node)
        for i in range(6):
            sim.create_pod("apps", f"p-{i}", ("node-a", "node-b", "node-dead")[i % 3])
        sim.empty_block("node-dead")  # a second block: both go with the node
        components_v1.start()
        before = sim.truth.leaked_ips()
        sim.leak_node_deleted("node-dead")  # its pods GC'd after it, no CNI DEL anywhere
        leaked = sim.truth.leaked_ips() - before
        assert len(leaked) == 3  # two pods, one tunnel IP
        wait_released(sim, leaked, alive=components_v1.alive)
        wait_until(lambda: node_gone(sim.store, "node-dead"), 60, what="node-dead's blocks and affinities")
        components_v1.alive()
        judge(sim)


def test_an_empty_block_is_released_after_the_grace_period(
    real_v1: RealCluster, components_v1: Components
) -> None:
    with actors(real_v1) as sim:
        sim.add_node("node-a")
        sim.create_pod("apps", "web", "node-a")
        extra = sim.empty_block("node-a")
        store = store_of(sim)
        components_v1.start()

        def released() -> bool:
            names = {b["metadata"]["name"] for b in store.list("ipamblocks")["items"]}
            return cidr_to_name(extra) not in names

        wait_until(released, 60, interval=0.25, what=f"the empty block {extra}")
        affinities = {a["spec"]["cidr"] for a in store.list("blockaffinities")["items"]}
        assert extra not in affinities
        assert len(sim.cni.node_blocks("node-a", 4)) >= 1  # the node's last block stays
        components_v1.alive()
        judge(sim)


def test_released_ips_cool_down_before_they_return(real_v1: RealCluster, components_v1: Components) -> None:
    cooldown = 3
    with actors(real_v1) as sim:
        cooling = Cooling()
        store_of(sim).add_hook(cooling.hook)
        sim.set_ip_cooldown(cooldown)
        sim.add_node("node-a")
        sim.add_node("node-b")
        for i in range(4):
            sim.create_pod("apps", f"p-{i}", "node-a")
        components_v1.start()
        leaked = set(sim.leak_pod_deleted_without_cni_del("apps", "p-0"))
        leaked |= set(sim.leak_pod_deleted_without_cni_del("apps", "p-1"))
        wait_released(sim, leaked, alive=components_v1.alive)
        wait_until(lambda: leaked <= set(cooling.parked), 30, what="the released IPs seen cooling")
        wait_until(lambda: leaked <= set(cooling.returned), 60, what="their return after the cooldown")
        for ip in leaked:
            released_at, returned_at = cooling.returned[ip]
            assert returned_at >= released_at + cooldown, (ip, released_at, returned_at)
        components_v1.alive()
        judge(sim)


def test_kubevirt_vm_leaks_are_released_and_live_vms_kept(
    real_v1: RealCluster, components_v1: Components
) -> None:
    with actors(real_v1, grace="1s") as sim:
        kv = KubeVirt(sim)
        for node in ("node-a", "node-b", "node-dead"):
            sim.add_node(node)
        kv.create_vm("vms", "keep", "node-a")
        kv.create_vm("vms", "moved", "node-a")
        kv.create_vm("vms", "gone", "node-b")
        kv.create_vm("vms", "lone", "node-b", standalone=True)
        kv.create_vm("vms", "dead", "node-dead")
        components_v1.start()
        kv.restart_vm("vms", "moved", "node-b")  # same IP on another node: kept
        live_leak = set(kv.leak_vm_deleted_without_cni_del("vms", "gone"))
        dead_leak = set(kv.lose_node("node-dead"))  # the VM deleted with its node
        wait_released(sim, dead_leak, alive=components_v1.alive)  # on a deleted node: at once
        # On a live node a VM's IP waits max(5 minutes, grace) as Calico's VM recreation grace: kept now.
        assert live_leak <= allocated_ips(store_of(sim))
        components_v1.alive()
        judge(sim)
