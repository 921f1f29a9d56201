"""KubeVirt on the simulated cluster: VirtualMachines, their instances, and their IPs as Calico gives them.

Why a module: Calico ≥ 3.32 gives a KubeVirt VM one IP for its life (`kubeVirtVMAddressPersistence`,
on by default): the CNI's handle is `k8s-pod-network.vmi.<namespace>.<vm>` rather than a container id,
and the allocation carries `vmi-name`, `vmi-uid` and `vm-uid` besides the virt-launcher pod's
`namespace`/`pod`/`node` (spec §2).  The GC judges such an allocation by the VM and VMI objects, not by
the pod (§3.8), so the simulated cluster serves `kubevirt.io/v1` (`ipamgc.sim.resources.
KUBEVIRT_RESOURCES`, on a store built with them) and this driver makes VMs and leaks them on purpose,
recording the truth: a VM deleted without a CNI DEL leaks its IP.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ipamgc.sim.objects import pod_object
from ipamgc.sim.resources import KUBEVIRT_GROUP, SimApiError

if TYPE_CHECKING:
    from ipamgc.sim.cluster import SimCluster

API_VERSION = f"{KUBEVIRT_GROUP}/v1"


def vm_handle(namespace: str, vm: str, network: str = "k8s-pod-network") -> str:
    """Calico's handle for a persistent VM address (hashed by Calico only beyond 128 characters)."""
    return f"{network}.vmi.{namespace}.{vm}"


def _uid(kind: str, namespace: str, name: str) -> str:
    h = hashlib.sha256(f"{kind}/{namespace}/{name}".encode()).hexdigest()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def vm_object(namespace: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "VirtualMachine",
        "metadata": {"name": name, "namespace": namespace, "uid": _uid("vm", namespace, name)},
        "spec": {"runStrategy": "Always"},
    }


def vmi_object(namespace: str, name: str, node: str, owned: bool) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": _uid("vmi", namespace, name)}
    if owned:
        meta["ownerReferences"] = [
            {
                "apiVersion": API_VERSION,
                "kind": "VirtualMachine",
                "name": name,
                "uid": _uid("vm", namespace, name),
                "controller": True,
            }
        ]
    return {
        "apiVersion": API_VERSION,
        "kind": "VirtualMachineInstance",
        "metadata": meta,
        "spec": {},
        "status": {"nodeName": node, "phase": "Running"},
    }


@dataclass
class SimVM:
    namespace: str
    name: str
    node: str
    launcher: str  # the virt-launcher pod
    handle: str
    ips: list[str]
    standalone: bool  # a VMI without a VirtualMachine


class KubeVirt:
    """Makes and removes VMs on a `SimCluster` whose store serves `kubevirt.io/v1`."""

    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster
        self.vms: dict[tuple[str, str], SimVM] = {}

    def create_vm(self, namespace: str, name: str, node: str, *, standalone: bool = False) -> SimVM:
        """A VM (or, `standalone`, a bare VMI) running on `node`: its objects, its launcher pod, its IP."""
        c = self.cluster
        if not standalone:
            c.store.create("virtualmachines", namespace, vm_object(namespace, name))
        c.store.create(
            "virtualmachineinstances", namespace, vmi_object(namespace, name, node, not standalone)
        )
        launcher = f"virt-launcher-{name}-{hashlib.sha256(name.encode()).hexdigest()[:5]}"
        handle = vm_handle(namespace, name)
        attrs = {
            "namespace": namespace,
            "node": node,
            "pod": launcher,
            "vmi-name": name,
            "vmi-uid": _uid("vmi", namespace, name),
            "timestamp": time.strftime("%Y-%m-%d %H:%M:%S.000000000 +0000 UTC", time.gmtime(c.clock())),
        }
        if not standalone:
            attrs["vm-uid"] = _uid("vm", namespace, name)
        at = c.clock()
        ips = [c.cni.assign(node, handle, attrs, version=4)]
        c.store.create("pods", namespace, pod_object(namespace, launcher, node, ips))
        c.truth.allocated(ips[0], handle, f"vm:{namespace}/{name}", at)
        vm = SimVM(namespace, name, node, launcher, handle, ips, standalone)
        self.vms[(namespace, name)] = vm
        return vm

    def delete_vm(self, namespace: str, name: str) -> None:
        """A clean deletion: the last launcher pod's CNI DEL releases the VM's IP, then the objects go."""
        vm = self.vms.pop((namespace, name))
        c = self.cluster
        c.truth.cni_freeing(vm.ips, True)
        try:
            c.cni.release_ips(vm.handle, vm.ips)
        finally:
            c.truth.cni_freeing(vm.ips, False)
        self._remove_objects(vm)

    def leak_vm_deleted_without_cni_del(self, namespace: str, name: str) -> list[str]:
        """The VM, its VMI and its launcher pod are gone, but no CNI DEL ran: the IP leaks."""
        vm = self.vms.pop((namespace, name))
        at = self.cluster.clock()
        for ip in vm.ips:
            self.cluster.truth.stop_using(ip, at)
        self._remove_objects(vm)
        return vm.ips

    def _remove_objects(self, vm: SimVM) -> None:
        store = self.cluster.store
        for plural, name in (
            ("pods", vm.launcher),
            ("virtualmachineinstances", vm.name),
            ("virtualmachines", vm.name),
        ):
            try:
                store.delete(plural, vm.namespace, name)
            except SimApiError as exc:
                if exc.code != 404:
                    raise
