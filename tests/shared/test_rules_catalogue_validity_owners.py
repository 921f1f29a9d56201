"""The rule catalogue, allocationIsValid in Calico's evaluation order (§3.7, §3.8), steps 1–5: tunnels, VM
allocations, no owner attributes, the pod lookup and a pod on another node (with the #12257 fix)."""

from __future__ import annotations

import pytest

from shared.allocrules import allocation_validity
from shared.model import Allocation
from shared.verdicts import KubeVirtView, Lookup, PodView, Reason
from tests.shared.catalogue_helpers import (
    N1,
    N2,
    NS,
    TUNNEL_TYPES,
    V6,
    VMS,
    _alloc,
    pod,
    pod_ip,
    tunnel_ip,
    vm_ip,
)

# ----------------------------------------------------------------------------------------------------
# allocationIsValid, in Calico's evaluation order (§3.7, §3.8)


VALIDITY_CASES = [
    # 1. tunnels: valid iff the node exists; pods never validate them
    *(
        pytest.param(
            tunnel_ip(kind=k), N1, Lookup.MISSING, None, True, Reason.TUNNEL_NODE_EXISTS, id=f"{k}-live"
        )
        for k in TUNNEL_TYPES
    ),
    *(
        pytest.param(tunnel_ip(kind=k), "", Lookup.MISSING, None, False, Reason.NODE_MISSING, id=f"{k}-gone")
        for k in TUNNEL_TYPES
    ),
    pytest.param(
        _alloc("10.244.1.0", "t", {"node": N1, "type": "ipipTunnelAddress", "namespace": NS, "pod": "web-0"}),
        "",
        pod(ips=("10.244.1.0",)),
        None,
        False,
        Reason.NODE_MISSING,
        id="tunnel-gone-node-not-saved-by-a-pod",
    ),
    # 2. VM allocations (§3.8)
    pytest.param(vm_ip(), N1, Lookup.MISSING, VMS, True, Reason.VM_EXISTS, id="vm-present"),
    pytest.param(
        vm_ip(vm="vm-1"), N1, pod(), VMS, False, Reason.VM_MISSING, id="vm-absent-even-if-launcher-pod-lives"
    ),
    pytest.param(
        vm_ip(vm="vm-1"),
        N1,
        Lookup.MISSING,
        KubeVirtView(frozenset(), {(NS, "vm-1"): False}),
        True,
        Reason.VMI_STANDALONE,
        id="vmi-standalone",
    ),
    pytest.param(
        vm_ip(vm="vm-1"),
        N1,
        Lookup.MISSING,
        KubeVirtView(frozenset(), {(NS, "vm-1"): True}),
        False,
        Reason.VM_MISSING,
        id="vmi-owned-by-deleted-vm",
    ),
    pytest.param(vm_ip(), N1, Lookup.MISSING, None, True, Reason.KUBEVIRT_ABSENT, id="vm-kubevirt-absent"),
    pytest.param(vm_ip(), N1, Lookup.MISSING, Lookup.UNKNOWN, True, Reason.VM_UNKNOWN, id="vm-lookup-error"),
    pytest.param(
        _alloc("10.244.1.9", "h", {"node": N1, "namespace": NS, "pod": "launcher", "vmi-name": ""}),
        N1,
        Lookup.MISSING,
        KubeVirtView(frozenset(), {}),
        True,
        Reason.NO_OWNER_ATTRIBUTES,
        id="vm-empty-vmi-name",
    ),
    pytest.param(
        _alloc("10.244.1.9", "h", {"node": N1, "vmi-name": "vm-1"}),
        N1,
        Lookup.MISSING,
        KubeVirtView(frozenset(), {}),
        True,
        Reason.NO_OWNER_ATTRIBUTES,
        id="vm-missing-namespace",
    ),
    # 3. no owner attributes: cannot judge, valid
    pytest.param(
        _alloc("10.244.1.5", "h", {"node": N1, "pod": "web-0"}),
        N1,
        Lookup.MISSING,
        None,
        True,
        Reason.NO_OWNER_ATTRIBUTES,
        id="namespace-attr-missing",
    ),
    pytest.param(
        _alloc("10.244.1.5", "h", {"node": N1, "namespace": NS}),
        N1,
        Lookup.MISSING,
        None,
        True,
        Reason.NO_OWNER_ATTRIBUTES,
        id="pod-attr-missing",
    ),
    pytest.param(
        pod_ip(pod=""),
        "",
        Lookup.MISSING,
        None,
        True,
        Reason.NO_OWNER_ATTRIBUTES,
        id="pod-attr-empty-node-gone",
    ),
    # 4. lookup
    pytest.param(pod_ip(), N1, Lookup.UNKNOWN, None, True, Reason.POD_UNKNOWN, id="pod-lookup-error"),
    pytest.param(pod_ip(), N1, Lookup.MISSING, None, False, Reason.POD_MISSING, id="pod-not-found"),
    pytest.param(pod_ip(), "", Lookup.MISSING, None, False, Reason.POD_MISSING, id="pod-not-found-node-gone"),
    # 5. pod on another node (with the #12257 fix)
    pytest.param(
        pod_ip(),
        N1,
        pod(node=N2, ips=("10.244.1.77",)),
        None,
        False,
        Reason.POD_ON_OTHER_NODE,
        id="other-node",
    ),
    pytest.param(
        pod_ip(),
        N1,
        pod(node=N2, ips=()),
        None,
        False,
        Reason.POD_ON_OTHER_NODE,
        id="other-node-checked-before-no-ip-yet",
    ),
    pytest.param(
        pod_ip(),
        N1,
        pod(node=N2, ips=("10.244.1.5",)),
        None,
        True,
        Reason.STALE_NODE_ATTRIBUTE,
        id="12257-other-node-reports-ip",
    ),
    pytest.param(
        pod_ip(ip=V6),
        N1,
        pod(node=N2, ips=("10.244.1.5", "FD00:10:244:0:0:0:0:5/128")),
        None,
        True,
        Reason.STALE_NODE_ATTRIBUTE,
        id="12257-other-node-reports-ip-in-another-spelling",
    ),
    pytest.param(
        pod_ip(),
        N1,
        pod(node=N2, ips=("10.244.1.5",), phase="Succeeded"),
        None,
        False,
        Reason.POD_ON_OTHER_NODE,
        id="12257-terminal-pod-on-other-node-is-not-saved",
    ),
    pytest.param(
        pod_ip(),
        "",
        pod(node=N2, ips=("10.244.1.5",)),
        None,
        True,
        Reason.POD_RUNNING,
        id="node-gone-skips-other-node-check",
    ),
    pytest.param(
        pod_ip(),
        "",
        pod(node=N2, ips=("10.244.1.77",)),
        None,
        False,
        Reason.POD_IP_MISMATCH,
        id="node-gone-other-node-mismatch",
    ),
    pytest.param(
        pod_ip(), N1, pod(node="", ips=()), None, True, Reason.NO_POD_IP_YET, id="unscheduled-pod-no-ip"
    ),
]


@pytest.mark.parametrize(("alloc", "knode", "pod_view", "kubevirt", "valid", "reason"), VALIDITY_CASES)
def test_allocation_validity(
    alloc: Allocation,
    knode: str,
    pod_view: PodView,
    kubevirt: KubeVirtView | Lookup | None,
    valid: bool,
    reason: Reason,
) -> None:
    v = allocation_validity(alloc, knode, pod_view, kubevirt)
    assert (v.valid, v.reason) == (valid, reason)
