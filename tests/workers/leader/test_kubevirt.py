"""The leader's last look at a KubeVirt VM allocation reads the VM and the VMI live (spec §3.8, §3.9).

The simulated cluster serves kubevirt.io/v1 here (a store built with `KUBEVIRT_RESOURCES`); its KubeVirt
driver allocates VM IPs as Calico's CNI does (handle `k8s-pod-network.vmi.<ns>.<vm>`, `vmi-name`, `vmi-uid`,
`vm-uid`) and records in the ground truth the IP of a VM deleted without a CNI DEL as leaked.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from lab.apiserver.apiserver import SimApiServer
from lab.apiserver.resources import KUBEVIRT_RESOURCES, RESOURCES
from lab.apiserver.store import Store
from lab.cluster.cluster import SimCluster
from lab.cluster.kubevirt import KubeVirt, vm_handle
from shared.allocrules import VM_RECREATION_GRACE_SECONDS, classify
from shared.keys import Keys
from shared.model import Allocation
from shared.parse import parse_block
from shared.verdicts import AllocationType
from tests.fixtures.leader import Env
from workers.leader import kube
from workers.leader.audit import Result
from workers.leader.recheck import Rechecker


@pytest.fixture
def kv_server() -> Iterator[SimApiServer]:
    with SimApiServer(Store(RESOURCES + KUBEVIRT_RESOURCES, seed=7), bookmark_interval=0.2) as srv:
        yield srv


def _allocation(store: Store, handle: str) -> Allocation:
    for raw in store.list("ipamblocks")["items"]:
        for a in parse_block(raw).iter_allocations():
            if a.handle == handle:
                return a
    raise AssertionError(f"no allocation of {handle}")


def _recheck(server: SimApiServer, client: redis.Redis, keys: Keys, a: Allocation) -> tuple[bool, str]:
    api_client = server.api_client()
    try:
        r = Rechecker(kube.CalicoApi(api_client), client, keys).check(a)
    finally:
        api_client.close()
    assert r.error is None, r.error
    return r.valid, r.reason


def test_vm_allocations_are_judged_by_the_live_vm_and_vmi(
    kv_server: SimApiServer, client: redis.Redis, keys: Keys
) -> None:
    sim = SimCluster(kv_server.store, seed=7)
    sim.bootstrap()
    sim.add_node("node-a")
    kv = KubeVirt(sim)
    vm = kv.create_vm("vms", "db", "node-a")
    bare = kv.create_vm("vms", "bare", "node-a", standalone=True)
    doomed = kv.create_vm("vms", "doomed", "node-a")
    orphan = kv.create_vm("vms", "orphan", "node-a")

    a = _allocation(kv_server.store, vm_handle("vms", "db"))
    assert a.handle == vm.handle and classify(a) is AllocationType.VM
    assert a.attrs["vmi-name"] == "db" and a.attrs["pod"] == vm.launcher
    assert _recheck(kv_server, client, keys, a) == (True, "vm-exists")
    assert _recheck(kv_server, client, keys, _allocation(kv_server.store, bare.handle)) == (
        True,
        "vmi-standalone",
    )

    # Deleted without a CNI DEL: the IP leaks (the ground truth says so) and the re-check agrees.
    leaked = kv.leak_vm_deleted_without_cni_del("vms", "doomed")
    assert sim.truth.leaked_ips() == set(leaked)
    assert _recheck(kv_server, client, keys, _allocation(kv_server.store, doomed.handle)) == (
        False,
        "vm-missing",
    )

    # The VM object is gone but its VMI is still there: owned by a deleted VM, it does not count.
    kv_server.store.delete("virtualmachines", "vms", "orphan")
    assert _recheck(kv_server, client, keys, _allocation(kv_server.store, orphan.handle)) == (
        False,
        "vm-missing",
    )

    # A clean deletion frees the IP through the CNI, which the ground truth does not count as a release.
    kv.delete_vm("vms", "db")
    assert sim.truth.violations == [] and sim.truth.unexpected == []


def test_without_kubevirt_a_vm_allocation_is_kept(client: redis.Redis, keys: Keys) -> None:
    """A cluster that does not serve kubevirt.io: every VM allocation is valid (Calico: informers nil)."""
    with SimApiServer(Store(RESOURCES + KUBEVIRT_RESOURCES, seed=7)) as kv_server, SimApiServer() as plain:
        sim = SimCluster(kv_server.store, seed=7)
        sim.bootstrap()
        sim.add_node("node-a")
        kv = KubeVirt(sim)
        kv.create_vm("vms", "gone", "node-a")
        kv.leak_vm_deleted_without_cni_del("vms", "gone")
        a = _allocation(kv_server.store, vm_handle("vms", "gone"))
        assert _recheck(kv_server, client, keys, a) == (False, "vm-missing")
        assert _recheck(plain, client, keys, a) == (True, "kubevirt-absent")


def test_a_vm_leaked_on_a_gone_node_goes_at_once_while_live_node_vm_candidates_wait_five_minutes(
    env: Env,
) -> None:
    """End to end on the simulated cluster: KubeVirt installed after the cluster started, the VM rule
    applied to the view the mirror gives the shard jobs, the leader's live re-check, the ground truth."""
    env.grace = 60.0  # a VM candidate on a live node waits max(5 min, grace): 5 minutes here
    store = env.server.store
    sim = env.sim
    for node in ("node-a", "node-b", "node-c"):
        sim.add_node(node)
    env.decide()  # nothing of KubeVirt served yet
    store.serve(KUBEVIRT_RESOURCES)  # KubeVirt installed later
    kv = KubeVirt(sim)
    running = kv.create_vm("vms", "running", "node-a")
    doomed = kv.create_vm("vms", "doomed", "node-a")
    lost = kv.create_vm("vms", "lost", "node-b")
    moved = kv.create_vm("vms", "moved", "node-b", standalone=True)
    env.decide()
    lead = env.leader()
    lead.step()
    assert env.audit() == []

    kv.restart_vm("vms", "moved", "node-c")  # restarted on another node: the same IP
    kv.migrate_vm("vms", "running", "node-c")  # live migration: the same IP
    assert kv.vms[("vms", "moved")].ips == moved.ips and kv.vms[("vms", "running")].ips == running.ips
    leaked_live = kv.leak_vm_deleted_without_cni_del("vms", "doomed")
    tunnel_b = {ip for ip in allocated_ips(store, node="node-b") if ip not in lost.ips}
    # node-b dies under "lost", deleted with it; "moved" runs on node-c now (its IP in node-b's block).
    leaked_gone = kv.lose_node("node-b")
    assert set(leaked_gone) == set(lost.ips)
    assert sim.truth.leaked_ips() == set(leaked_live) | set(leaked_gone) | tunnel_b

    # The VM on the gone node is confirmed at once, and then the node's tunnel IP (nothing valid is left).
    assert env.decide() == 2
    lead.step()
    ips = [r for r in env.audit() if r.ip]
    assert {(r.result, r.ip, r.evidence["recheck"]["reason"]) for r in ips} == {
        (Result.RELEASED, lost.ips[0], "vm-missing"),
        *((Result.RELEASED, ip, "node-missing") for ip in tunnel_b),
    }
    [vm_rec] = [r for r in env.audit() if r.ip in lost.ips]
    assert vm_rec.evidence["recheck"]["kubevirt"] == "no-vm-no-vmi"

    # node-b's block stays: it holds the IP "moved" keeps (node-c's now), so the node cannot be cleaned.
    assert [(r.result, r.node) for r in env.audit() if not r.ip] == [(Result.REFUSED_VALID, "node-b")]

    env.clock.advance(VM_RECREATION_GRACE_SECONDS)  # exactly 5 minutes: not yet (strictly after)
    assert env.decide() == 0
    lead.step()
    assert len([r for r in env.audit() if r.ip]) == 2
    env.clock.advance(1.0)
    assert env.decide() == 1
    lead.step()
    [last] = [r for r in env.audit() if r.ip][2:]
    assert (last.result, last.ip, last.evidence["recheck"]["reason"]) == (
        Result.RELEASED,
        doomed.ips[0],
        "vm-missing",
    )
    assert sim.truth.violations == [] and sim.truth.leaked_ips() == set()
    assert allocated_ips(store, node="node-c") >= set(moved.ips) | set(running.ips)
    assert env.consistent() == []


def allocated_ips(store: Store, node: str) -> set[str]:
    return {
        a.ip
        for raw in store.list("ipamblocks")["items"]
        for a in parse_block(raw).iter_allocations()
        if a.node == node
    }
