"""KubeVirt's objects as the VM rule reads them: slim records, their typing at the edge, their Redis form.

Why a module: Calico ≥ 3.32 judges a VM allocation (one with a `vmi-name` attribute) by the KubeVirt
VirtualMachine and VirtualMachineInstance of that name (spec §3.8), not by the virt-launcher pod.  The rule
needs very little of either object: a VM only exists; a VMI exists and either has an ownerReference of kind
`VirtualMachine` or not (Calico's `hasVMOwner`).  The watcher mirrors exactly that (`P:vms`, `P:vmis`;
records in `shared/records.py`), the workers build the rule's `KubeVirtView` from it, and `ipamgc check`
from a snapshot (`view_from_objects`).  Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from shared import errors as e
from shared.keys import pod_key
from shared.model import ATTR_NAMESPACE, ATTR_VMI_NAME, Allocation
from shared.verdicts import KubeVirtView

KUBEVIRT_GROUP = "kubevirt.io"
KUBEVIRT_VERSION = "v1"
KUBEVIRT_API_VERSION = f"{KUBEVIRT_GROUP}/{KUBEVIRT_VERSION}"
VM_KIND = "VirtualMachine"
VMI_KIND = "VirtualMachineInstance"
VMS = "virtualmachines"
VMIS = "virtualmachineinstances"


@dataclass(frozen=True, slots=True)
class VirtualMachine:
    namespace: str
    name: str
    uid: str = ""

    @property
    def key(self) -> str:
        return pod_key(self.namespace, self.name)


@dataclass(frozen=True, slots=True)
class VirtualMachineInstance:
    namespace: str
    name: str
    uid: str = ""
    owned_by_vm: bool = False  # an ownerReference of kind VirtualMachine (Calico's `hasVMOwner`)

    @property
    def key(self) -> str:
        return pod_key(self.namespace, self.name)


def vm_key_of(a: Allocation) -> str | None:
    """`<namespace>/<vmi-name>` of a VM allocation (its VM and VMI key), None when either is missing."""
    ns, vmi = a.attrs.get(ATTR_NAMESPACE, ""), a.attrs.get(ATTR_VMI_NAME, "")
    return pod_key(ns, vmi) if ns and vmi else None


# -- typing raw JSON ----------------------------------------------------------------------------------------


def _meta(kind: str, raw: object) -> tuple[str, str, Mapping[str, Any]]:
    if not isinstance(raw, Mapping):
        raise e.WrongFieldType(kind, "", f"object is a {type(raw).__name__}, not a JSON object")
    meta = raw.get("metadata")
    if not isinstance(meta, Mapping):
        raise e.MissingMetadata(kind, "", "no metadata")
    name, ns = meta.get("name"), meta.get("namespace")
    if not isinstance(name, str) or not name:
        raise e.MissingMetadata(kind, "", "metadata.name missing or not a string")
    if not isinstance(ns, str) or not ns:
        raise e.MissingMetadata(kind, name, "metadata.namespace missing or not a string")
    return ns, name, meta


def _uid(meta: Mapping[str, Any]) -> str:
    uid = meta.get("uid")
    return uid if isinstance(uid, str) else ""


def parse_vm(raw: object) -> VirtualMachine:
    ns, name, meta = _meta(VM_KIND, raw)
    return VirtualMachine(ns, name, _uid(meta))


def has_vm_owner(kind: str, name: str, meta: Mapping[str, Any]) -> bool:
    """Calico's `hasVMOwner`: any ownerReference of kind VirtualMachine.  Unreadable → MalformedObject."""
    refs = meta.get("ownerReferences")
    if refs is None:
        return False
    if not isinstance(refs, list):
        raise e.WrongFieldType(kind, name, "metadata.ownerReferences is not a list")
    return any(isinstance(r, Mapping) and r.get("kind") == VM_KIND for r in refs)


def parse_vmi(raw: object) -> VirtualMachineInstance:
    ns, name, meta = _meta(VMI_KIND, raw)
    return VirtualMachineInstance(ns, name, _uid(meta), has_vm_owner(VMI_KIND, name, meta))


# -- the rule's view ----------------------------------------------------------------------------------------


def view_from_objects(vms: Iterable[VirtualMachine], vmis: Iterable[VirtualMachineInstance]) -> KubeVirtView:
    """The `KubeVirtView` of a whole set of objects (a snapshot)."""
    return KubeVirtView(
        frozenset((v.namespace, v.name) for v in vms),
        {(i.namespace, i.name): i.owned_by_vm for i in vmis},
    )
