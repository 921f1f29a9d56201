"""KubeVirt on the simulated cluster: VirtualMachines, their instances, and their IPs as Calico gives them.

Why a module: Calico ≥ 3.32 gives a KubeVirt VM one IP for its life (`kubeVirtVMAddressPersistence`,
on by default): the CNI's handle is `k8s-pod-network.vmi.<namespace>.<vm>` rather than a container id,
and the allocation carries `vmi-name`, `vmi-uid` and `vm-uid` besides the virt-launcher pod's
`namespace`/`pod`/`node` (spec §2).  The GC judges such an allocation by the VM and VMI objects, not by
the pod (§3.8), so the simulated cluster serves `kubevirt.io/v1` (`lab.apiserver.resources.
KUBEVIRT_RESOURCES`, on a store built with them) and this driver makes VMs and leaks them on purpose,
recording the truth: a VM deleted without a CNI DEL leaks its IP, and so does a VM deleted with the node it
ran on.  As Calico's CNI (`handleVirtLauncherPod`), a launcher pod whose VM handle already holds IPs reuses
them: a restarted VM (new VMI, new launcher pod, perhaps on another node) keeps its IP, its owner attributes
rewritten (`SetOwnerAttributes`); a live migration's target is first the alternate owner
(`alternateOwnerAttrs`), then the active one when the migration completes.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lab.apiserver.resources import KUBEVIRT_GROUP, SimApiError
from lab.cluster.objects import pod_object, put_pod
from lab.cluster.podshape import LAUNCHER_CREATOR

if TYPE_CHECKING:
    from lab.cluster.cluster import SimCluster

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


def vmi_object(
    namespace: str, name: str, node: str, owned: bool, generation: int = 0, vm_uid: str | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": _vmi_uid(namespace, name, generation),
    }
    if owned:
        meta["ownerReferences"] = [
            {
                "apiVersion": API_VERSION,
                "kind": "VirtualMachine",
                "name": name,
                "uid": vm_uid or _uid("vm", namespace, name),
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


def _vmi_uid(namespace: str, name: str, generation: int) -> str:
    return _uid("vmi", namespace, f"{name}#{generation}" if generation else name)


def _launcher(name: str, generation: int) -> str:
    return f"virt-launcher-{name}-{hashlib.sha256(f'{name}#{generation}'.encode()).hexdigest()[:5]}"


@dataclass
class SimVM:
    namespace: str
    name: str
    node: str
    launcher: str  # the virt-launcher pod
    handle: str
    ips: list[str]
    standalone: bool  # a VMI without a VirtualMachine
    generation: int = 0  # VMIs made for this VM so far, minus one (each restart makes a new one)
    vm_uid: str = ""  # the uids the API server gave the VM and its current VMI (a real server
    vmi_uid: str = ""  # chooses them itself, whatever a create asks for)


class KubeVirt:
    """Makes and removes VMs on a `SimCluster` whose store serves `kubevirt.io/v1`."""

    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster
        self.vms: dict[tuple[str, str], SimVM] = {}

    def create_vm(self, namespace: str, name: str, node: str, *, standalone: bool = False) -> SimVM:
        """A VM (or, `standalone`, a bare VMI) running on `node`: its objects, its launcher pod, its IP."""
        c = self.cluster
        vm_uid = ""
        c.store.ensure_namespace(namespace)
        if not standalone:
            vm_uid = c.store.create("virtualmachines", namespace, vm_object(namespace, name))["metadata"][
                "uid"
            ]
        vmi = c.store.create(
            "virtualmachineinstances",
            namespace,
            vmi_object(namespace, name, node, not standalone, vm_uid=vm_uid or None),
        )
        vm = SimVM(namespace, name, node, _launcher(name, 0), vm_handle(namespace, name), [], standalone)
        vm.vm_uid, vm.vmi_uid = vm_uid, vmi["metadata"]["uid"]
        at = c.clock()
        vm.ips = self._cni_add(vm, node)
        self._put_launcher(namespace, vm.launcher, node, vm.ips)
        for ip in vm.ips:
            c.truth.allocated(ip, vm.handle, f"vm:{namespace}/{name}", at)
        self.vms[(namespace, name)] = vm
        return vm

    def _put_launcher(self, namespace: str, pod: str, node: str, ips: list[str]) -> None:
        """A virt-launcher pod (made by virt-controller, no ReplicaSet), in the cluster's pod size."""
        c = self.cluster
        obj = pod_object(namespace, pod, node, ips, size=c.pod_size, seed=c.seed, launcher=True)
        put_pod(c.store, obj, field_manager=LAUNCHER_CREATOR)

    def _attrs(self, vm: SimVM, node: str, launcher: str) -> dict[str, str]:
        attrs = {
            "namespace": vm.namespace,
            "node": node,
            "pod": launcher,
            "vmi-name": vm.name,
            "vmi-uid": vm.vmi_uid or _vmi_uid(vm.namespace, vm.name, vm.generation),
            "timestamp": time.strftime(
                "%Y-%m-%d %H:%M:%S.000000000 +0000 UTC", time.gmtime(self.cluster.clock())
            ),
        }
        if not vm.standalone:
            attrs["vm-uid"] = vm.vm_uid or _uid("vm", vm.namespace, vm.name)
        return attrs

    def _cni_add(self, vm: SimVM, node: str) -> list[str]:
        """Calico's CNI ADD for a launcher pod: the VM handle's IPs when it holds some (their active owner
        rewritten), else a new one."""
        cni = self.cluster.cni
        attrs = self._attrs(vm, node, _launcher(vm.name, vm.generation))
        existing = cni.ips_by_handle(vm.handle)
        if existing:
            for ip in existing:
                cni.set_owner_attributes(ip, vm.handle, active=attrs)
            return existing
        return [cni.assign(node, vm.handle, attrs, version=4)]

    def restart_vm(self, namespace: str, name: str, node: str | None = None) -> SimVM:
        """The VM's VMI and launcher pod replaced (a restart, or a rescheduling onto `node`): same IP."""
        vm = self.vms[(namespace, name)]
        c = self.cluster
        node = node or vm.node
        self._delete(("pods", vm.launcher), ("virtualmachineinstances", vm.name), namespace=namespace)
        vm.generation += 1
        vm.node, vm.launcher = node, _launcher(name, vm.generation)
        vmi = c.store.create(
            "virtualmachineinstances",
            namespace,
            vmi_object(namespace, name, node, not vm.standalone, vm.generation, vm.vm_uid or None),
        )
        vm.vmi_uid = vmi["metadata"]["uid"]
        ips = self._cni_add(vm, node)
        assert ips == vm.ips, f"VM {namespace}/{name} changed IP across a restart: {vm.ips} → {ips}"
        self._put_launcher(namespace, vm.launcher, node, vm.ips)
        return vm

    def migrate_vm(self, namespace: str, name: str, node: str) -> SimVM:
        """A live migration to `node`: the target launcher pod is the IP's alternate owner while it runs,
        then the active one; the source pod goes; the VMI stays (its status moves)."""
        vm = self.vms[(namespace, name)]
        c = self.cluster
        target = _launcher(name, vm.generation + 1)
        attrs = self._attrs(vm, node, target) | {"vmim-uid": _uid("vmim", namespace, target)}
        for ip in vm.ips:
            c.cni.set_owner_attributes(ip, vm.handle, alternate=attrs)
        self._put_launcher(namespace, target, node, vm.ips)
        for ip in vm.ips:  # the migration completed: the target owns the IP, the source pod goes
            c.cni.set_owner_attributes(ip, vm.handle, active=attrs, clear_alternate=True)
        self._delete(("pods", vm.launcher), namespace=namespace)
        vmi = c.store.get("virtualmachineinstances", namespace, name)
        vmi["status"]["nodeName"] = node
        c.store.replace("virtualmachineinstances", namespace, name, vmi)
        vm.generation += 1
        vm.node, vm.launcher = node, target
        return vm

    def lose_node(self, node: str, *, delete_vms: bool = True, move_to: str | None = None) -> list[str]:
        """The node dies under its VMs (`SimCluster.delete_node`: nobody runs CNI DEL there).  With
        `delete_vms` their VMs are deleted too and their IPs leak (returned); otherwise each VM is
        restarted on `move_to` and keeps its IP."""
        c = self.cluster
        on_node = [vm for vm in self.vms.values() if vm.node == node]
        c.delete_node(node)
        leaked: list[str] = []
        for vm in on_node:
            if delete_vms:
                leaked += self.leak_vm_deleted_without_cni_del(vm.namespace, vm.name)
            else:
                if move_to is None:
                    raise ValueError("move_to: the node the VMs restart on")
                self.restart_vm(vm.namespace, vm.name, move_to)
        return leaked

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
        self._delete(
            ("pods", vm.launcher),
            ("virtualmachineinstances", vm.name),
            ("virtualmachines", vm.name),
            namespace=vm.namespace,
        )

    def _delete(self, *objects: tuple[str, str], namespace: str) -> None:
        store = self.cluster.store
        for plural, name in objects:
            try:
                # a launcher pod: the kubelet's confirmation (grace 0); the others have no grace period
                store.delete(plural, namespace, name, grace_period_seconds=0)
            except SimApiError as exc:
                if exc.code != 404:
                    raise
