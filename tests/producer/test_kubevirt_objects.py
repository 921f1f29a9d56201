"""Malformed KubeVirt objects from the API become what keeps IPs: a VM or VMI that exists and is not owned by
a VM (its VM allocation stays valid), or, unidentifiable, nothing (a relist then deletes nothing)."""

from __future__ import annotations

from typing import Any

import pytest

from lab.cluster.kubevirt import vm_object, vmi_object
from producer.kinds import Kind
from producer.typed import convert
from shared.allocrules import allocation_validity
from shared.kubevirt import VirtualMachine, VirtualMachineInstance, view_from_objects
from shared.model import Allocation
from shared.verdicts import Lookup, Reason


def _vm_allocation(name: str) -> Allocation:
    attrs = {"node": "n", "namespace": "vms", "pod": f"virt-launcher-{name}", "vmi-name": name}
    return Allocation("10.0.0.1", 1, "10.0.0.0/26", f"k8s-pod-network.vmi.vms.{name}", attrs, 1)


def test_well_formed_objects_are_typed_slim() -> None:
    vm = convert(Kind.VMS, vm_object("vms", "db"))
    assert vm.key == "vms/db" and vm.problem is None and isinstance(vm.obj, VirtualMachine)
    vmi = convert(Kind.VMIS, vmi_object("vms", "db", "node-a", owned=True))
    assert isinstance(vmi.obj, VirtualMachineInstance) and vmi.obj.owned_by_vm and vmi.problem is None
    bare = convert(Kind.VMIS, vmi_object("vms", "bare", "node-a", owned=False))
    assert isinstance(bare.obj, VirtualMachineInstance) and not bare.obj.owned_by_vm


@pytest.mark.parametrize(
    "change",
    [
        lambda o: o["metadata"].update(ownerReferences="not a list"),
        lambda o: o.update(metadata={"name": "db", "namespace": "vms", "ownerReferences": [{"kind": 5}, 3]}),
    ],
    ids=["owner-references-not-a-list", "junk-owner-references"],
)
def test_a_malformed_vmi_keeps_its_vms_ip(change: Any) -> None:
    raw = vmi_object("vms", "db", "node-a", owned=True)
    change(raw)
    typed = convert(Kind.VMIS, raw)
    assert typed.key == "vms/db" and isinstance(typed.obj, VirtualMachineInstance)
    assert not typed.obj.owned_by_vm  # counts as standalone: valid
    validity = allocation_validity(
        _vm_allocation("db"), "n", Lookup.UNKNOWN, view_from_objects([], [typed.obj])
    )
    assert validity.valid and validity.reason is Reason.VMI_STANDALONE


@pytest.mark.parametrize("kind", [Kind.VMS, Kind.VMIS])
def test_an_unidentifiable_object_is_nothing(kind: Kind) -> None:
    for raw in ({"metadata": {"name": "db"}}, {"metadata": "x"}, "junk"):
        typed = convert(kind, raw)
        assert typed.key is None and typed.obj is None and typed.problem is not None
