"""The validity rules, row by row against Calico's behaviour (`calico-ipam-gc.md` §3.6–§3.10, §4, §8, §10).

Every row of the §4 summary table, every item of Calico's own test catalogue (§10) that can be decided without
a live system, and the §8 edge cases 1, 2, 3, 12–18 and 22.  Calico's decision is the expected one, except for
the deliberately fixed bug #12257 (PR #13538): a pod that reports the allocation IP keeps it, whatever the
allocation's `node` attribute says.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from shared.allocrules import (
    VM_RECREATION_GRACE_SECONDS,
    allocation_validity,
    classify,
    judge,
    leak_grace,
    mark_leak,
)
from shared.blockops import new_block_object
from shared.model import Allocation, AllocationID, IPAMBlock, Pod
from shared.parse import parse_block
from shared.podips import UnparsablePodIP, pod_reported_ips
from shared.rules import (
    NodeVerdict,
    evaluate_empty_block,
    evaluate_node,
    evaluate_unaffine_block,
    handle_release,
)
from shared.verdicts import AllocationType, KubeVirtView, LeakState, Lookup, PodView, Reason, Release, Verdict

N1, N2, N3 = "node-1", "node-2", "node-3"
NS = "default"
LGP = 900.0  # Calico's default leakGracePeriod, 15m
T0 = 10_000.0  # when an allocation was first seen invalid
MIGRATION = "projectcalico.org/node-network-during-migration"
TUNNEL_TYPES = (
    "ipipTunnelAddress",
    "vxlanTunnelAddress",
    "vxlanV6TunnelAddress",
    "wireguardTunnelAddress",
    "wireguardV6TunnelAddress",
)

# ----------------------------------------------------------------------------------------------------
# builders


def _alloc(ip: str, handle: str, attrs: Mapping[str, str]) -> Allocation:
    addr = ipaddress.ip_address(ip)
    net = ipaddress.ip_network(f"{ip}/{26 if addr.version == 4 else 122}", strict=False)
    return Allocation(
        ip=ip,
        ordinal=int(addr) - int(net.network_address),
        block=str(net),
        handle=handle,
        attrs=dict(attrs),
        sequence_number=1_737_481_904_000_000_000,
    )


def pod_ip(
    ip: str = "10.244.1.5",
    pod: str = "web-0",
    node: str | None = N1,
    ns: str = NS,
    handle: str | None = None,
    **extra: str,
) -> Allocation:
    attrs = {"namespace": ns, "pod": pod, "timestamp": "2025-01-21 17:51:44.123456789 +0000 UTC", **extra}
    if node is not None:
        attrs["node"] = node
    return _alloc(ip, handle or f"k8s-pod-network.{ns}.{pod}", attrs)


def vm_ip(
    ip: str = "10.244.1.9", vm: str = "vm-0", pod: str = "virt-launcher-vm-0-abcde", node: str = N1
) -> Allocation:
    attrs = {"namespace": NS, "pod": pod, "node": node, "vmi-name": vm, "vmi-uid": "u-1"}
    return _alloc(ip, f"k8s-pod-network.vmi.{NS}.{vm}", attrs)


def tunnel_ip(ip: str = "10.244.1.0", kind: str = "vxlanTunnelAddress", node: str = N1) -> Allocation:
    prefix = {
        "ipipTunnelAddress": "ipip-tunnel-addr",
        "vxlanTunnelAddress": "vxlan-tunnel-addr",
        "vxlanV6TunnelAddress": "vxlan-v6-tunnel-addr",
        "wireguardTunnelAddress": "wireguard-tunnel-addr",
        "wireguardV6TunnelAddress": "wireguard-v6-tunnel-addr",
    }[kind]
    if "V6" in kind and ":" not in ip:
        ip = "fd00:10:244::"
    return _alloc(ip, f"{prefix}-{node}", {"node": node, "type": kind})


def unknown_ip(ip: str = "10.244.1.20", node: str = N1) -> Allocation:
    """A `node` attribute, but neither a pod's nor a tunnel's (e.g. a LoadBalancer IP with a node)."""
    return _alloc(ip, "lb-q2VuZXJhdGVkU2VydmljZQ", {"node": node, "service": "ingress", "namespace": NS})


def reserved_ip(ip: str = "10.244.1.1", node: str = N1) -> Allocation:
    return _alloc(ip, "windows-reserved-ipam-handle", {"note": "windows host rsvd", "node": node})


def pod(
    name: str = "web-0",
    node: str = N1,
    ips: Sequence[str] = ("10.244.1.5",),
    phase: str = "Running",
    *,
    pod_ip: str | None = None,
    reason: str = "",
    annotations: Mapping[str, str] | None = None,
    deleting: bool = False,
    ns: str = NS,
) -> Pod:
    return Pod(
        namespace=ns,
        name=name,
        node_name=node,
        phase=phase,
        reason=reason,
        pod_ip=(ips[0] if ips else "") if pod_ip is None else pod_ip,
        pod_ips=tuple(ips),
        annotations=dict(annotations or {}),
        deletion_timestamp=deleting,
    )


def _pods(*views: Pod) -> dict[tuple[str, str], PodView]:
    return {(p.namespace, p.name): p for p in views}


def _lookup(pods: Mapping[tuple[str, str], PodView]) -> Any:
    def look(ns: str, name: str) -> PodView:
        return pods.get((ns, name), Lookup.MISSING)

    return look


def _by_ip(nv: NodeVerdict) -> dict[str, Verdict]:
    return {v.allocation.ip: v for v in nv.verdicts}


def _block(
    cidr: str = "10.244.1.0/26",
    affinity: str | None = f"host:{N1}",
    used: Mapping[int, Mapping[str, Any]] | None = None,
) -> IPAMBlock:
    """An IPAMBlock parsed from Calico JSON; `used` maps ordinals to raw attributes."""
    net = ipaddress.ip_network(cidr)
    obj = new_block_object(net, None, 1_737_481_904_000_000_000, None)
    spec = obj["spec"]
    spec["affinity"] = affinity
    for ordinal, attr in (used or {}).items():
        spec["attributes"].append(dict(attr))
        spec["allocations"][ordinal] = len(spec["attributes"]) - 1
        spec["unallocated"].remove(ordinal)
        spec["sequenceNumberForAllocation"][str(ordinal)] = spec["sequenceNumber"]
    return parse_block(obj)


VMS = KubeVirtView(vms=frozenset({(NS, "vm-0")}), vmis_owned_by_vm={})

# ----------------------------------------------------------------------------------------------------
# classification (§2.2)


@pytest.mark.parametrize(
    ("alloc", "expected"),
    [
        *(pytest.param(tunnel_ip(kind=k), AllocationType.TUNNEL, id=f"tunnel-{k}") for k in TUNNEL_TYPES),
        pytest.param(pod_ip(), AllocationType.POD, id="pod-namespace-and-pod"),
        pytest.param(vm_ip(), AllocationType.VM, id="vm-vmi-name-present"),
        pytest.param(reserved_ip(), AllocationType.RESERVED, id="windows-reserved-handle"),
        pytest.param(
            _alloc("10.244.1.2", "Windows-Reserved-IPAM-Handle", {"node": N1}),
            AllocationType.UNKNOWN,
            id="windows-handle-is-case-sensitive",
        ),
        pytest.param(unknown_ip(), AllocationType.UNKNOWN, id="loadbalancer-with-node-is-unknown"),
        pytest.param(
            _alloc("10.244.1.3", "vxlan-tunnel-addr-node-1", {"node": N1}),
            AllocationType.UNKNOWN,
            id="handle-prefix-not-parsed",
        ),
        pytest.param(
            _alloc("10.244.1.3", "h", {"node": N1, "namespace": NS}), AllocationType.UNKNOWN, id="no-pod-attr"
        ),
        pytest.param(
            _alloc("10.244.1.3", "h", {"node": N1, "pod": "web-0"}), AllocationType.UNKNOWN, id="no-ns-attr"
        ),
        pytest.param(
            _alloc("10.244.1.3", "h", {"node": N1, "namespace": "", "pod": ""}),
            AllocationType.UNKNOWN,
            id="empty-owner-attrs",
        ),
        pytest.param(
            _alloc("10.244.1.3", "h", {"node": N1, "namespace": NS, "vmi-name": "vm-0"}),
            AllocationType.UNKNOWN,
            id="vmi-name-without-pod-is-not-a-pod-ip",
        ),
        pytest.param(
            _alloc("10.244.1.3", "h", {"node": N1, "namespace": NS, "pod": "p", "type": "ipipTunnelAddress"}),
            AllocationType.TUNNEL,
            id="tunnel-type-wins-over-pod-attrs",
        ),
        pytest.param(
            _alloc("10.244.1.3", "h", {"node": N1, "type": "LoadBalancer"}),
            AllocationType.UNKNOWN,
            id="other-type-is-unknown",
        ),
    ],
)
def test_classify(alloc: Allocation, expected: AllocationType) -> None:
    assert classify(alloc) is expected


# ----------------------------------------------------------------------------------------------------
# allocationIsValid, in Calico's evaluation order (§3.7, §3.8)

V6 = "fd00:10:244::5"

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
    # 6. no IP reported yet (status.podIP == "" or status.podIPs empty)
    pytest.param(pod_ip(), N1, pod(ips=()), None, True, Reason.NO_POD_IP_YET, id="no-ip-yet"),
    pytest.param(
        pod_ip(),
        N1,
        pod(ips=(), pod_ip="10.244.1.77"),
        None,
        True,
        Reason.NO_POD_IP_YET,
        id="no-ip-yet-podIP-without-podIPs",
    ),
    pytest.param(
        pod_ip(),
        N1,
        pod(ips=("10.244.1.77",), pod_ip=""),
        None,
        True,
        Reason.NO_POD_IP_YET,
        id="no-ip-yet-podIPs-without-podIP",
    ),
    pytest.param(
        pod_ip(),
        N1,
        pod(ips=(), annotations={"cni.projectcalico.org/podIPs": "10.244.1.77/32"}),
        None,
        True,
        Reason.NO_POD_IP_YET,
        id="no-ip-yet-annotations-do-not-override-status",
    ),
    pytest.param(
        pod_ip(),
        N1,
        pod(ips=(), phase="Succeeded"),
        None,
        True,
        Reason.NO_POD_IP_YET,
        id="no-ip-yet-before-phase",
    ),
    # 7. evicted
    pytest.param(
        pod_ip(),
        N1,
        pod(phase="Failed", reason="Evicted"),
        None,
        False,
        Reason.POD_EVICTED,
        id="failed-evicted-reporting-the-ip",
    ),
    pytest.param(
        pod_ip(),
        N1,
        pod(ips=(), phase="Failed", reason="Evicted"),
        None,
        True,
        Reason.NO_POD_IP_YET,
        id="evicted-without-ip-is-no-ip-yet",
    ),
    pytest.param(
        pod_ip(),
        N1,
        pod(phase="Running", reason="Evicted"),
        None,
        True,
        Reason.POD_RUNNING,
        id="evicted-not-failed",
    ),
    # 8. finished pods: their IP list is empty
    *(
        pytest.param(
            pod_ip(), N1, pod(phase=phase), None, False, Reason.POD_TERMINATED, id=f"terminal-{phase.lower()}"
        )
        for phase in ("Succeeded", "Failed", "Completed")
    ),
    # Calico's cache has no deletion timestamp (`PodTransformer`): a blanked annotation finishes
    # nothing there, the pod's status still reports the IP (the live view: LIVE_VALIDITY_CASES).
    pytest.param(
        pod_ip(),
        N1,
        pod(deleting=True, annotations={"cni.projectcalico.org/podIP": ""}),
        None,
        True,
        Reason.POD_RUNNING,
        id="deleting-calico-annotation-blank-cache-view",
    ),
    pytest.param(
        pod_ip(),
        N1,
        pod(deleting=True, annotations={"vpc.amazonaws.com/pod-ips": ""}),
        None,
        True,
        Reason.POD_RUNNING,
        id="deleting-aws-annotation-blank-cache-view",
    ),
    # A finished pod's IPs are parsed before its phase is looked at (`getPodIPs`, then `IsFinished`).
    *(
        pytest.param(
            pod_ip(),
            N1,
            pod(ips=("10.244.1.999",), phase=phase),
            None,
            True,
            Reason.POD_IP_UNPARSABLE,
            id=f"terminal-{phase.lower()}-unparsable-ip",
        )
        for phase in ("Succeeded", "Failed", "Completed")
    ),
    # No `status.reason` in Calico's cache: an evicted pod is a failed one, decided after the parse.
    pytest.param(
        pod_ip(),
        N1,
        pod(ips=("10.244.1.999",), phase="Failed", reason="Evicted"),
        None,
        True,
        Reason.POD_IP_UNPARSABLE,
        id="evicted-unparsable-ip-cache-view",
    ),
    pytest.param(
        pod_ip(),
        N1,
        pod(ips=("10.244.1.6",), phase="Failed", reason="Evicted"),
        None,
        False,
        Reason.POD_EVICTED,
        id="evicted-other-ip-cache-view",
    ),
    pytest.param(
        pod_ip(),
        N1,
        pod(deleting=True, annotations={"cni.projectcalico.org/podIP": "10.244.1.5/32"}),
        None,
        True,
        Reason.POD_RUNNING,
        id="deleting-calico-annotation-set",
    ),
    pytest.param(
        pod_ip(),
        N1,
        pod(deleting=True),
        None,
        True,
        Reason.POD_RUNNING,
        id="deleting-without-annotation",
    ),
    pytest.param(
        pod_ip(),
        N1,
        pod(annotations={"cni.projectcalico.org/podIP": ""}),
        None,
        True,
        Reason.POD_RUNNING,
        id="blank-annotation-without-deletion",
    ),
    pytest.param(
        pod_ip(),
        N1,
        pod(deleting=True, annotations={"cni.projectcalico.org/podIPs": ""}),
        None,
        True,
        Reason.POD_RUNNING,
        id="deleting-plural-annotation-blank-does-not-finish",
    ),
    # 9. parsed comparison
    pytest.param(pod_ip(), N1, pod(), None, True, Reason.POD_RUNNING, id="running-match"),
    pytest.param(pod_ip(), N1, pod(phase="Pending"), None, True, Reason.POD_RUNNING, id="pending-match"),
    pytest.param(
        pod_ip(ip=V6),
        N1,
        pod(ips=("10.244.1.5", V6)),
        None,
        True,
        Reason.POD_RUNNING,
        id="dual-stack-second-ip",
    ),
    pytest.param(
        pod_ip(ip=V6),
        N1,
        pod(ips=("10.244.1.5", "fd00:10:244::6"), pod_ip="10.244.1.5"),
        None,
        False,
        Reason.POD_IP_MISMATCH,
        id="dual-stack-other-v6",
    ),
    pytest.param(
        pod_ip(ip=V6),
        N1,
        pod(ips=("fd00:10:244:0:0:0:0:5",)),
        None,
        True,
        Reason.POD_RUNNING,
        id="ipv6-exploded",
    ),
    pytest.param(
        pod_ip(ip="fd00:10:244:0:0:0:0:5"),
        N1,
        pod(ips=(V6,)),
        None,
        True,
        Reason.POD_RUNNING,
        id="alloc-exploded",
    ),
    pytest.param(
        pod_ip(ip=V6), N1, pod(ips=("FD00:10:244::5",)), None, True, Reason.POD_RUNNING, id="ipv6-upper-case"
    ),
    pytest.param(
        pod_ip(ip=V6),
        N1,
        pod(ips=("fd00:10:244::5/128",)),
        None,
        True,
        Reason.POD_RUNNING,
        id="ipv6-slash-128",
    ),
    pytest.param(
        pod_ip(), N1, pod(ips=("10.244.1.5/32",)), None, True, Reason.POD_RUNNING, id="ipv4-slash-32"
    ),
    pytest.param(
        pod_ip(), N1, pod(ips=("::ffff:10.244.1.5",)), None, True, Reason.POD_RUNNING, id="ipv4-mapped-ipv6"
    ),
    pytest.param(
        pod_ip(), N1, pod(ips=("10.244.1.50",)), None, False, Reason.POD_IP_MISMATCH, id="no-prefix-match"
    ),
    pytest.param(
        pod_ip(ip=V6),
        N1,
        pod(ips=("fd00:10:244::50",)),
        None,
        False,
        Reason.POD_IP_MISMATCH,
        id="no-v6-prefix-match",
    ),
    pytest.param(
        pod_ip(), N1, pod(ips=("10.244.1.6",)), None, False, Reason.POD_IP_MISMATCH, id="ip-mismatch"
    ),
    pytest.param(
        pod_ip(), N1, pod(ips=("10.244.1.999",)), None, True, Reason.POD_IP_UNPARSABLE, id="unparsable-pod-ip"
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


# The final re-check of a leak on a node that exists reads the pod live (§3.9): Calico then sees the
# deletion timestamp and `status.reason` its cache does not hold.
LIVE_VALIDITY_CASES = [
    pytest.param(
        pod(deleting=True, annotations={"cni.projectcalico.org/podIP": ""}),
        False,
        Reason.POD_TERMINATED,
        id="deleting-calico-annotation-blank",
    ),
    pytest.param(
        pod(deleting=True, annotations={"vpc.amazonaws.com/pod-ips": ""}),
        False,
        Reason.POD_TERMINATED,
        id="deleting-aws-annotation-blank",
    ),
    pytest.param(
        pod(deleting=True, annotations={"cni.projectcalico.org/podIPs": ""}),
        True,
        Reason.POD_RUNNING,
        id="deleting-plural-annotation-blank-does-not-finish",
    ),
    pytest.param(
        pod(ips=("10.244.1.999",), phase="Failed", reason="Evicted"),
        False,
        Reason.POD_EVICTED,
        id="evicted-decided-before-the-parse",
    ),
    pytest.param(
        pod(ips=("10.244.1.999",), phase="Succeeded"),
        True,
        Reason.POD_IP_UNPARSABLE,
        id="succeeded-unparsable",
    ),
    pytest.param(pod(), True, Reason.POD_RUNNING, id="running-match"),
]


@pytest.mark.parametrize(("pod_view", "valid", "reason"), LIVE_VALIDITY_CASES)
def test_allocation_validity_of_a_live_read(pod_view: PodView, valid: bool, reason: Reason) -> None:
    v = allocation_validity(pod_ip(), N1, pod_view, live=True)
    assert (v.valid, v.reason) == (valid, reason)


@pytest.mark.parametrize(
    "p",
    [
        pytest.param(
            pod(ips=(), annotations={"cni.projectcalico.org/podIPs": "garbage"}), id="no-ip-bad-annotation"
        ),
        pytest.param(pod(ips=("10.244.1.5", "10.244.1.999")), id="one-good-one-bad"),
        pytest.param(pod(ips=("fd00::zz",)), id="bad-v6"),
    ],
)
def test_unparsable_pod_ips_keep_the_allocation(p: Pod) -> None:
    """§3.7: no IP reported yet, or conversion/parse errors → valid (everything ambiguous keeps the IP)."""
    assert allocation_validity(pod_ip(), N1, p).valid
    assert allocation_validity(pod_ip(), "", p).valid


# ----------------------------------------------------------------------------------------------------
# Calico's workload-endpoint IP derivation (§3.7 step 8)


@pytest.mark.parametrize(
    ("p", "expected"),
    [
        pytest.param(pod(ips=("10.244.1.5", V6)), ["10.244.1.5", V6], id="status-podIPs"),
        pytest.param(
            pod(ips=("10.244.1.5",), pod_ip="10.244.1.9"), ["10.244.1.5"], id="podIPs-preferred-over-podIP"
        ),
        pytest.param(pod(ips=(), pod_ip="10.244.1.9"), ["10.244.1.9"], id="status-podIP"),
        pytest.param(
            pod(
                ips=(),
                annotations={
                    "cni.projectcalico.org/podIPs": "10.244.1.5/32,fd00:10:244::5/128",
                    "cni.projectcalico.org/podIP": "10.244.1.8/32",
                    "vpc.amazonaws.com/pod-ips": "10.244.1.9",
                },
            ),
            ["10.244.1.5", V6],
            id="annotation-podIPs",
        ),
        pytest.param(
            pod(
                ips=(),
                annotations={
                    "cni.projectcalico.org/podIP": "10.244.1.8/32",
                    "vpc.amazonaws.com/pod-ips": "10.244.1.9",
                },
            ),
            ["10.244.1.8"],
            id="annotation-podIP",
        ),
        pytest.param(
            pod(ips=(), annotations={"vpc.amazonaws.com/pod-ips": "10.244.1.9,10.244.1.10"}),
            ["10.244.1.9", "10.244.1.10"],
            id="annotation-aws",
        ),
        pytest.param(
            pod(ips=("10.244.1.5",), annotations={"cni.projectcalico.org/podIPs": "10.244.1.8"}),
            ["10.244.1.5"],
            id="status-preferred-over-annotations",
        ),
        pytest.param(pod(ips=()), [], id="nothing"),
        pytest.param(pod(phase="Succeeded"), [], id="finished-has-no-ips"),
    ],
)
def test_pod_reported_ips(p: Pod, expected: list[str]) -> None:
    assert pod_reported_ips(p) == [ipaddress.ip_address(x) for x in expected]


def test_a_blanked_annotation_empties_the_ips_of_a_terminating_pod_only_when_read_live() -> None:
    p = pod(deleting=True, annotations={"cni.projectcalico.org/podIP": ""})
    assert pod_reported_ips(p) == [ipaddress.ip_address("10.244.1.5")]  # Calico's cache: no timestamp
    assert pod_reported_ips(p, live=True) == []


def test_a_finished_pods_ips_are_parsed_before_its_phase_is_looked_at() -> None:
    with pytest.raises(UnparsablePodIP):
        pod_reported_ips(pod(ips=("10.244.1.999",), phase="Succeeded"))


# ----------------------------------------------------------------------------------------------------
# markLeak and the grace periods (§3.6 steps 3.5–3.8)


@pytest.mark.parametrize(
    ("first_seen", "grace", "now", "state", "start"),
    [
        pytest.param(None, LGP, T0, LeakState.CANDIDATE, T0, id="first-observation-starts-timer"),
        pytest.param(T0, LGP, T0 + LGP - 1, LeakState.CANDIDATE, T0, id="within-grace"),
        pytest.param(T0, LGP, T0 + LGP, LeakState.CANDIDATE, T0, id="exactly-grace-is-not-enough"),
        pytest.param(T0, LGP, T0 + LGP + 0.001, LeakState.CONFIRMED, T0, id="strictly-after-grace"),
        pytest.param(T0, 0.0, T0 + 10**9, LeakState.CANDIDATE, T0, id="grace-0-never-confirms"),
        pytest.param(None, 0.0, T0, LeakState.CANDIDATE, T0, id="grace-0-first-observation"),
        pytest.param(T0, 1.0, T0 + 1.5, LeakState.CONFIRMED, T0, id="fv-lgp-1s"),
    ],
)
def test_mark_leak(
    first_seen: float | None, grace: float, now: float, state: LeakState, start: float
) -> None:
    assert mark_leak(first_seen, grace, now) == (state, start)


@pytest.mark.parametrize(
    ("grace", "is_vm", "expected"),
    [
        pytest.param(None, False, None, id="pod-unset"),
        pytest.param(0.0, False, 0.0, id="pod-zero"),
        pytest.param(LGP, False, LGP, id="pod-lgp"),
        pytest.param(None, True, VM_RECREATION_GRACE_SECONDS, id="vm-unset-5m"),
        pytest.param(0.0, True, VM_RECREATION_GRACE_SECONDS, id="vm-zero-5m"),
        pytest.param(60.0, True, VM_RECREATION_GRACE_SECONDS, id="vm-smaller-5m"),
        pytest.param(LGP, True, LGP, id="vm-larger-lgp"),
    ],
)
def test_leak_grace(grace: float | None, is_vm: bool, expected: float | None) -> None:
    assert VM_RECREATION_GRACE_SECONDS == 300.0
    assert leak_grace(grace, is_vm) == expected


# ----------------------------------------------------------------------------------------------------
# One node's pass (§3.6) — the rows of §4's summary table and §10's catalogue


@dataclass(frozen=True)
class NodeCase:
    node_exists: bool
    allocations: tuple[Allocation, ...]
    pods: Mapping[tuple[str, str], PodView] = field(default_factory=dict)
    grace: float | None = LGP
    now: float = T0
    timers: Mapping[str, float] = field(default_factory=dict)  # by IP
    expect: Mapping[str, tuple[LeakState, Reason]] = field(default_factory=dict)  # by IP
    releasable: bool | None = None
    kubevirt: KubeVirtView | Lookup | None = None


P_RUN = pod()
A_POD = pod_ip()
A_TUN = tunnel_ip()

NODE_CASES = [
    # §4: node gone + pod missing / mismatched → confirmed at first check, whatever the grace period
    *(
        pytest.param(
            NodeCase(False, (A_POD,), grace=g, expect={A_POD.ip: (LeakState.CONFIRMED, Reason.POD_MISSING)}),
            id=f"node-gone-pod-missing-confirmed-grace-{g}",
        )
        for g in (None, 0.0, LGP)
    ),
    pytest.param(
        NodeCase(
            False,
            (A_POD,),
            pods=_pods(pod(ips=("10.244.1.6",))),
            grace=0.0,
            expect={A_POD.ip: (LeakState.CONFIRMED, Reason.POD_IP_MISMATCH)},
        ),
        id="node-gone-pod-mismatch-confirmed",
    ),
    pytest.param(
        NodeCase(
            False,
            (A_POD,),
            pods=_pods(pod(phase="Succeeded")),
            grace=None,
            expect={A_POD.ip: (LeakState.CONFIRMED, Reason.POD_TERMINATED)},
        ),
        id="node-gone-terminal-pod-confirmed",
    ),
    pytest.param(
        NodeCase(
            False,
            (vm_ip(vm="vm-9"),),
            grace=LGP,
            expect={"10.244.1.9": (LeakState.CONFIRMED, Reason.VM_MISSING)},
            kubevirt=VMS,
        ),
        id="node-gone-vm-missing-confirmed-without-vm-grace",
    ),
    # §4: node gone + tunnel IP → confirmed only when nothing valid/unknown remains
    *(
        pytest.param(
            NodeCase(
                False,
                (tunnel_ip(kind=k),),
                grace=None,
                expect={tunnel_ip(kind=k).ip: (LeakState.CONFIRMED, Reason.NODE_MISSING)},
                releasable=True,
            ),
            id=f"node-gone-only-{k}-confirmed",
        )
        for k in TUNNEL_TYPES
    ),
    *(
        pytest.param(
            NodeCase(
                True,
                (tunnel_ip(kind=k),),
                expect={tunnel_ip(kind=k).ip: (LeakState.VALID, Reason.TUNNEL_NODE_EXISTS)},
                releasable=False,
            ),
            id=f"node-live-{k}-never",
        )
        for k in TUNNEL_TYPES
    ),
    pytest.param(
        NodeCase(
            False,
            (A_TUN, A_POD),
            grace=0.0,
            expect={
                A_TUN.ip: (LeakState.CONFIRMED, Reason.NODE_MISSING),
                A_POD.ip: (LeakState.CONFIRMED, Reason.POD_MISSING),
            },
            releasable=True,
        ),
        id="node-gone-tunnel-and-leaked-pod-single-pass",
    ),
    pytest.param(
        NodeCase(
            False,
            (A_TUN, A_POD),
            pods=_pods(pod(node=N1)),
            expect={
                A_TUN.ip: (LeakState.IGNORED, Reason.NODE_IN_USE),
                A_POD.ip: (LeakState.VALID, Reason.POD_RUNNING),
            },
            releasable=False,
        ),
        id="node-gone-pod-still-exists-keeps-tunnel",
    ),
    pytest.param(
        NodeCase(
            False,
            (A_POD, A_TUN),
            pods=_pods(pod(node=N1)),
            expect={A_TUN.ip: (LeakState.IGNORED, Reason.NODE_IN_USE)},
            releasable=False,
        ),
        id="node-gone-valid-pod-listed-before-tunnel",
    ),
    pytest.param(
        NodeCase(
            False,
            (A_TUN, A_POD),
            pods=_pods(pod(ips=())),
            expect={
                A_TUN.ip: (LeakState.IGNORED, Reason.NODE_IN_USE),
                A_POD.ip: (LeakState.VALID, Reason.NO_POD_IP_YET),
            },
            releasable=False,
        ),
        id="node-gone-pod-without-ip-keeps-tunnel",
    ),
    pytest.param(
        NodeCase(
            False,
            (A_TUN, A_POD),
            pods={(NS, "web-0"): Lookup.UNKNOWN},
            expect={A_TUN.ip: (LeakState.IGNORED, Reason.NODE_IN_USE)},
            releasable=False,
        ),
        id="node-gone-pod-lookup-error-keeps-tunnel",
    ),
    pytest.param(
        NodeCase(
            False,
            (A_TUN, unknown_ip()),
            expect={
                A_TUN.ip: (LeakState.IGNORED, Reason.NODE_IN_USE),
                "10.244.1.20": (LeakState.VALID, Reason.UNKNOWN_SOURCE),
            },
            releasable=False,
        ),
        id="node-gone-unknown-source-blocks-cleanup",
    ),
    pytest.param(
        NodeCase(
            False,
            (A_TUN, _alloc("10.244.1.21", "legacy", {"node": N1, "namespace": NS})),
            expect={A_TUN.ip: (LeakState.IGNORED, Reason.NODE_IN_USE)},
            releasable=False,
        ),
        id="node-gone-allocation-without-pod-attr-blocks-cleanup",
    ),
    pytest.param(
        NodeCase(
            False,
            (A_TUN, reserved_ip()),
            expect={
                A_TUN.ip: (LeakState.CONFIRMED, Reason.NODE_MISSING),
                "10.244.1.1": (LeakState.VALID, Reason.WINDOWS_RESERVED),
            },
            releasable=True,
        ),
        id="node-gone-windows-reserved-does-not-block",
    ),
    pytest.param(
        NodeCase(
            False,
            (A_TUN, vm_ip()),
            kubevirt=VMS,
            expect={
                A_TUN.ip: (LeakState.IGNORED, Reason.NODE_IN_USE),
                "10.244.1.9": (LeakState.VALID, Reason.VM_EXISTS),
            },
            releasable=False,
        ),
        id="node-gone-live-vm-keeps-tunnel",
    ),
    pytest.param(NodeCase(False, (), releasable=True), id="node-gone-no-allocations-releasable"),
    pytest.param(NodeCase(True, (), releasable=False), id="node-live-never-releasable"),
    pytest.param(
        NodeCase(
            True, (A_POD,), expect={A_POD.ip: (LeakState.CANDIDATE, Reason.POD_MISSING)}, releasable=False
        ),
        id="node-live-leak-not-releasable",
    ),
    # §4: node exists + pod not found / on a different node / IPs don't include / terminal → candidate
    pytest.param(
        NodeCase(True, (A_POD,), expect={A_POD.ip: (LeakState.CANDIDATE, Reason.POD_MISSING)}),
        id="node-live-pod-missing-candidate",
    ),
    pytest.param(
        NodeCase(
            True,
            (A_POD,),
            pods=_pods(pod(node=N2, ips=("10.244.2.7",))),
            expect={A_POD.ip: (LeakState.CANDIDATE, Reason.POD_ON_OTHER_NODE)},
        ),
        id="node-live-pod-on-other-node-candidate",
    ),
    pytest.param(
        NodeCase(
            True,
            (A_POD,),
            pods=_pods(pod(node=N2, ips=(A_POD.ip,))),
            expect={A_POD.ip: (LeakState.VALID, Reason.STALE_NODE_ATTRIBUTE)},
        ),
        id="node-live-12257-stale-node-attribute-valid",
    ),
    pytest.param(
        NodeCase(
            True,
            (A_POD,),
            pods=_pods(pod(ips=("10.244.1.6",))),
            expect={A_POD.ip: (LeakState.CANDIDATE, Reason.POD_IP_MISMATCH)},
        ),
        id="node-live-ip-mismatch-candidate",
    ),
    *(
        pytest.param(
            NodeCase(
                True,
                (A_POD,),
                pods=_pods(pod(phase=ph)),
                expect={A_POD.ip: (LeakState.CANDIDATE, Reason.POD_TERMINATED)},
            ),
            id=f"node-live-terminal-{ph.lower()}-candidate",
        )
        for ph in ("Succeeded", "Failed", "Completed")
    ),
    pytest.param(
        NodeCase(
            True,
            (A_POD,),
            pods=_pods(pod(phase="Failed", reason="Evicted")),
            expect={A_POD.ip: (LeakState.CANDIDATE, Reason.POD_EVICTED)},
        ),
        id="node-live-evicted-candidate",
    ),
    pytest.param(
        NodeCase(
            True,
            (A_POD,),
            pods=_pods(pod(ips=())),
            timers={A_POD.ip: T0 - 10 * LGP},
            now=T0,
            expect={A_POD.ip: (LeakState.VALID, Reason.NO_POD_IP_YET)},
        ),
        id="node-live-no-ip-yet-valid",
    ),
    pytest.param(
        NodeCase(
            True,
            (_alloc("10.244.1.5", "h", {"node": N1}),),
            timers={"10.244.1.5": 0.0},
            now=T0,
            expect={"10.244.1.5": (LeakState.VALID, Reason.UNKNOWN_SOURCE)},
        ),
        id="node-live-non-pod-allocation-never-cleaned",
    ),
    pytest.param(
        NodeCase(True, (A_POD,), pods=_pods(P_RUN), expect={A_POD.ip: (LeakState.VALID, Reason.POD_RUNNING)}),
        id="fv-ip-matching-status-kept",
    ),
    # candidate → confirmed strictly after LGP
    pytest.param(
        NodeCase(
            True,
            (A_POD,),
            timers={A_POD.ip: T0},
            now=T0 + LGP,
            expect={A_POD.ip: (LeakState.CANDIDATE, Reason.POD_MISSING)},
        ),
        id="node-live-exactly-lgp-not-confirmed",
    ),
    pytest.param(
        NodeCase(
            True,
            (A_POD,),
            timers={A_POD.ip: T0},
            now=T0 + LGP + 0.5,
            expect={A_POD.ip: (LeakState.CONFIRMED, Reason.POD_MISSING)},
        ),
        id="node-live-after-lgp-confirmed",
    ),
    pytest.param(
        NodeCase(
            True,
            (A_POD,),
            timers={A_POD.ip: T0},
            now=T0 + 1.5,
            grace=1.0,
            expect={A_POD.ip: (LeakState.CONFIRMED, Reason.POD_MISSING)},
        ),
        id="fv-lgp-1s-ip-with-no-pod-cleaned",
    ),
    # LGP unset / 0
    pytest.param(
        NodeCase(
            True,
            (A_POD,),
            grace=None,
            timers={A_POD.ip: 0.0},
            now=T0,
            expect={A_POD.ip: (LeakState.IGNORED, Reason.POD_MISSING)},
        ),
        id="lgp-unset-live-node-never-candidate",
    ),
    pytest.param(
        NodeCase(
            True,
            (A_POD,),
            grace=0.0,
            timers={A_POD.ip: 0.0},
            now=T0 * 1000,
            expect={A_POD.ip: (LeakState.CANDIDATE, Reason.POD_MISSING)},
        ),
        id="lgp-0-candidate-never-confirmed",
    ),
    # VM allocations on live nodes: grace max(5m, LGP)
    *(
        pytest.param(
            NodeCase(
                True,
                (vm_ip(vm="vm-9"),),
                kubevirt=VMS,
                grace=g,
                timers={"10.244.1.9": T0},
                now=T0 + dt,
                expect={"10.244.1.9": (state, Reason.VM_MISSING)},
            ),
            id=f"vm-grace-{g}-after-{dt}s-{state.value}",
        )
        for g, dt, state in (
            (60.0, 299.0, LeakState.CANDIDATE),
            (60.0, 300.0, LeakState.CANDIDATE),
            (60.0, 300.5, LeakState.CONFIRMED),
            (None, 299.0, LeakState.CANDIDATE),
            (None, 301.0, LeakState.CONFIRMED),
            (0.0, 299.0, LeakState.CANDIDATE),
            (0.0, 301.0, LeakState.CONFIRMED),
            (LGP, 600.0, LeakState.CANDIDATE),
            (LGP, LGP, LeakState.CANDIDATE),
            (LGP, LGP + 1, LeakState.CONFIRMED),
        )
    ),
    pytest.param(
        NodeCase(
            True,
            (vm_ip(),),
            kubevirt=VMS,
            timers={"10.244.1.9": T0},
            now=T0 + 200,
            expect={"10.244.1.9": (LeakState.VALID, Reason.VM_EXISTS)},
        ),
        id="vm-reappears-within-grace-stops-gc",
    ),
    pytest.param(
        NodeCase(
            True,
            (vm_ip(),),
            kubevirt=None,
            expect={"10.244.1.9": (LeakState.VALID, Reason.KUBEVIRT_ABSENT)},
        ),
        id="vm-kubevirt-absent-valid",
    ),
]


@pytest.mark.parametrize("case", NODE_CASES)
def test_evaluate_node(case: NodeCase) -> None:
    timers: dict[AllocationID, float] = {}
    for a in case.allocations:
        if a.ip in case.timers:
            timers[a.id] = case.timers[a.ip]
    nv = evaluate_node(
        N1,
        case.node_exists,
        case.allocations,
        _lookup(case.pods),
        timers,
        case.grace,
        case.now,
        case.kubevirt,
    )
    assert nv.node == N1
    assert nv.node_exists is case.node_exists
    got = _by_ip(nv)
    assert sorted(got) == sorted(a.ip for a in case.allocations)
    for ip, (state, reason) in case.expect.items():
        assert (got[ip].state, got[ip].reason) == (state, reason), ip
        assert got[ip].valid is (state is LeakState.VALID)
    for v in nv.verdicts:
        if v.state is LeakState.VALID:
            assert v.first_seen is None  # markValid clears the timer
        if v.state in (LeakState.CANDIDATE, LeakState.CONFIRMED):
            assert v.first_seen is not None
    if case.releasable is not None:
        assert nv.releasable is case.releasable


def test_node_gone_confirms_at_first_sight_and_keeps_the_timer_start() -> None:
    a = pod_ip()
    nv = evaluate_node(N1, False, [a], _lookup({}), {}, None, T0)
    assert (nv.verdicts[0].state, nv.verdicts[0].first_seen) == (LeakState.CONFIRMED, T0)
    nv = evaluate_node(N1, False, [a], _lookup({}), {a.id: T0 - 5}, None, T0)
    assert nv.verdicts[0].first_seen == T0 - 5


def test_candidate_timer_starts_at_first_observation_then_confirms() -> None:
    """§4.2: pod deleted without CNI DEL on a live node: candidate now, confirmed at the first check > LGP."""
    a = pod_ip()
    first = evaluate_node(N1, True, [a], _lookup({}), {}, LGP, T0).verdicts[0]
    assert (first.state, first.first_seen) == (LeakState.CANDIDATE, T0)
    timers = {a.id: first.first_seen}
    for now, state in ((T0 + LGP / 2, LeakState.CANDIDATE), (T0 + LGP, LeakState.CANDIDATE)):
        v = evaluate_node(N1, True, [a], _lookup({}), timers, LGP, now).verdicts[0]
        assert (v.state, v.first_seen) == (state, T0)
    v = evaluate_node(N1, True, [a], _lookup({}), timers, LGP, T0 + LGP + 1).verdicts[0]
    assert (v.state, v.first_seen) == (LeakState.CONFIRMED, T0)


def test_valid_observation_resets_the_candidate() -> None:
    """§8.3: a pod recreated between syncs — any later valid observation clears the timer (markValid)."""
    a = pod_ip()
    v = evaluate_node(N1, True, [a], _lookup(_pods(pod())), {a.id: T0}, LGP, T0 + 2 * LGP).verdicts[0]
    assert (v.state, v.first_seen) == (LeakState.VALID, None)


def test_statefulset_name_reuse() -> None:
    """§8.14: a new pod with the old name and no IP keeps the old allocation; once it reports its IP, not."""
    old = pod_ip(ip="10.244.1.5", pod="db-0", handle="k8s-pod-network.old")
    new_without_ip = pod(name="db-0", ips=())
    v = evaluate_node(N1, True, [old], _lookup(_pods(new_without_ip)), {}, LGP, T0).verdicts[0]
    assert (v.state, v.reason) == (LeakState.VALID, Reason.NO_POD_IP_YET)
    new_with_ip = pod(name="db-0", ips=("10.244.1.6",))
    v = evaluate_node(N1, True, [old], _lookup(_pods(new_with_ip)), {}, LGP, T0).verdicts[0]
    assert (v.state, v.reason) == (LeakState.CANDIDATE, Reason.POD_IP_MISMATCH)


def test_judge_grace_rules() -> None:
    a = pod_ip()
    bad = allocation_validity(a, N1, Lookup.MISSING)
    assert judge(a, AllocationType.POD, bad, False, None, None, T0).state is LeakState.CONFIRMED
    assert judge(a, AllocationType.POD, bad, True, None, None, T0).state is LeakState.IGNORED
    assert judge(a, AllocationType.POD, bad, True, 0.0, T0 - 10**6, T0).state is LeakState.CANDIDATE
    assert judge(a, AllocationType.POD, bad, True, LGP, T0 - LGP, T0).state is LeakState.CANDIDATE
    assert judge(a, AllocationType.POD, bad, True, LGP, T0 - LGP - 1, T0).state is LeakState.CONFIRMED
    assert judge(a, AllocationType.VM, bad, True, 0.0, T0 - 301, T0).state is LeakState.CONFIRMED
    assert judge(a, AllocationType.VM, bad, True, None, T0 - 300, T0).state is LeakState.CANDIDATE
    good = allocation_validity(a, N1, pod())
    v = judge(a, AllocationType.POD, good, True, LGP, T0 - 10 * LGP, T0)
    assert (v.state, v.first_seen) == (LeakState.VALID, None)


# ----------------------------------------------------------------------------------------------------
# Handle all-or-none (§3.9 step 3, §8.1 #5044, §8.15)


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        pytest.param([LeakState.CONFIRMED], Release.NOW, id="one-confirmed"),
        pytest.param([LeakState.CONFIRMED, LeakState.CONFIRMED], Release.NOW, id="all-confirmed"),
        pytest.param(
            [LeakState.CONFIRMED, LeakState.CANDIDATE], Release.AFTER_GRACE, id="one-still-candidate"
        ),
        pytest.param([LeakState.CANDIDATE, LeakState.CANDIDATE], Release.AFTER_GRACE, id="all-candidates"),
        pytest.param([LeakState.CONFIRMED, LeakState.VALID], Release.NEVER, id="one-valid"),
        pytest.param([LeakState.CANDIDATE, LeakState.VALID], Release.NEVER, id="candidate-and-valid"),
        pytest.param([LeakState.CONFIRMED, LeakState.IGNORED], Release.NEVER, id="one-ignored"),
        pytest.param([LeakState.VALID], Release.NEVER, id="valid"),
        pytest.param([LeakState.IGNORED], Release.NEVER, id="ignored"),
        pytest.param([], Release.NEVER, id="no-allocations"),
    ],
)
def test_handle_release(states: list[LeakState], expected: Release) -> None:
    assert handle_release(states) is expected
    assert handle_release(iter(states)) is expected


def _handle_states(verdicts: Sequence[Verdict], handle: str) -> list[LeakState]:
    return [v.state for v in verdicts if v.allocation.handle == handle]


@pytest.mark.parametrize("node_exists", [True, False], ids=["node-live", "node-gone"])
def test_dual_stack_with_single_stack_status_releases_nothing(node_exists: bool) -> None:
    """§8.1 (#5044): the IPv6 of a dual-stack pod whose status lists IPv4 only must not free the IPv4."""
    h = "k8s-pod-network.dual"
    v4, v6 = pod_ip(ip="10.244.1.5", handle=h), pod_ip(ip=V6, handle=h)
    timers = {v4.id: 0.0, v6.id: 0.0}
    nv = evaluate_node(N1, node_exists, [v4, v6], _lookup(_pods(pod(ips=("10.244.1.5",)))), timers, LGP, T0)
    got = _by_ip(nv)
    assert got[v4.ip].state is LeakState.VALID
    assert got[v6.ip].reason is Reason.POD_IP_MISMATCH
    assert got[v6.ip].state is LeakState.CONFIRMED  # the IP alone is a leak…
    assert handle_release(_handle_states(nv.verdicts, h)) is Release.NEVER  # …but its handle holds it


def test_leaked_ip_released_after_grace_unless_another_ip_of_its_handle_is_valid() -> None:
    """§10: released after the grace period; not released if another IP on the same handle is valid."""
    h = "k8s-pod-network.shared"
    a, b = pod_ip(ip="10.244.1.5", handle=h), pod_ip(ip="10.244.1.6", pod="web-1", handle=h)
    timers = {a.id: T0, b.id: T0}
    nv = evaluate_node(N1, True, [a, b], _lookup({}), timers, LGP, T0 + LGP + 1)
    assert handle_release(_handle_states(nv.verdicts, h)) is Release.NOW
    nv = evaluate_node(
        N1, True, [a, b], _lookup(_pods(pod(name="web-1", ips=(b.ip,)))), timers, LGP, T0 + LGP + 1
    )
    assert _by_ip(nv)[a.ip].state is LeakState.CONFIRMED
    assert handle_release(_handle_states(nv.verdicts, h)) is Release.NEVER
    nv = evaluate_node(N1, True, [a, b], _lookup({}), timers, None, T0 + LGP + 1)
    assert handle_release(_handle_states(nv.verdicts, h)) is Release.NEVER  # no grace period: node alive


def test_vm_handle_all_or_none_spans_nodes() -> None:
    """§8.15: one VM handle on two nodes (live migration): released only when every IP of it is a leak."""
    on_gone = vm_ip(ip="10.244.1.9", node=N1, pod="virt-launcher-a")
    on_live = vm_ip(ip="10.244.2.9", node=N2, pod="virt-launcher-b")
    assert on_gone.handle == on_live.handle
    no_vm = KubeVirtView(frozenset(), {})
    gone = evaluate_node(N1, False, [on_gone], _lookup({}), {}, LGP, T0, no_vm)
    live = evaluate_node(N2, True, [on_live], _lookup({}), {on_live.id: T0}, LGP, T0 + 60, no_vm)
    assert handle_release([*_handle_states(gone.verdicts, on_gone.handle), live.verdicts[0].state]) is (
        Release.AFTER_GRACE
    )
    live = evaluate_node(N2, True, [on_live], _lookup({}), {on_live.id: T0}, LGP, T0 + LGP + 1, no_vm)
    assert handle_release([gone.verdicts[0].state, live.verdicts[0].state]) is Release.NOW
    # The VM comes back: both IPs are valid again, on either node.
    gone = evaluate_node(N1, False, [on_gone], _lookup({}), {}, LGP, T0, VMS)
    live = evaluate_node(N2, True, [on_live], _lookup({}), {on_live.id: T0}, LGP, T0 + LGP + 1, VMS)
    assert [gone.verdicts[0].state, live.verdicts[0].state] == [LeakState.VALID, LeakState.VALID]
    assert gone.releasable is False


def test_node_deletion_waits_for_pods_then_cleans_in_one_pass() -> None:
    """§10: allocations untouched while their pods exist; once gone, IPs and affinities go in one pass."""
    a, b, t = pod_ip(ip="10.244.1.5"), pod_ip(ip="10.244.1.6", pod="web-1"), tunnel_ip()
    pods = _pods(pod(), pod(name="web-1", ips=(b.ip,)))
    nv = evaluate_node(N1, False, [t, a, b], _lookup(pods), {}, LGP, T0)
    assert [v.state for v in nv.verdicts if v.allocation.ip != t.ip] == [LeakState.VALID, LeakState.VALID]
    assert _by_ip(nv)[t.ip].state is LeakState.IGNORED
    assert not nv.releasable
    nv = evaluate_node(N1, False, [t, a, b], _lookup({}), {}, LGP, T0)
    assert {v.state for v in nv.verdicts} == {LeakState.CONFIRMED}
    assert all(handle_release([v.state]) is Release.NOW for v in nv.verdicts)
    assert nv.releasable


# ----------------------------------------------------------------------------------------------------
# Empty blocks (§3.10, §3.11, §8.16–18, §8.22)

EMPTY = _block()
POD_ATTR = {"handle_id": "k8s-pod-network.x", "secondary": {"node": N1, "namespace": NS, "pod": "web-0"}}
WINDOWS_ATTR = {"handle_id": "windows-reserved-ipam-handle", "secondary": {"note": "windows host rsvd"}}
COOLDOWN_ATTR = {"releasedAt": "2026-01-01T00:00:00Z"}


@dataclass(frozen=True)
class BlockCase:
    block: IPAMBlock
    release: Release | None  # None: not an empty host-affine block at all
    reason: Reason | None = None
    node_exists: bool = True
    node_releasable: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)
    affine_blocks: int = 2
    grace: float | None = LGP
    first_empty: float | None = T0
    now: float = T0 + LGP + 1


BLOCK_CASES = [
    pytest.param(BlockCase(EMPTY, Release.NOW, Reason.EMPTY_BLOCK), id="empty-after-grace-released"),
    pytest.param(
        BlockCase(EMPTY, Release.AFTER_GRACE, Reason.EMPTY_BLOCK, now=T0 + LGP),
        id="empty-exactly-grace-not-enough",
    ),
    pytest.param(
        BlockCase(EMPTY, Release.AFTER_GRACE, Reason.EMPTY_BLOCK, now=T0 + 200, grace=300.0),
        id="fv-lgp-5m-not-within-grace",
    ),
    pytest.param(
        BlockCase(EMPTY, Release.NOW, Reason.EMPTY_BLOCK, now=T0 + 301, grace=300.0),
        id="fv-lgp-5m-after-grace",
    ),
    pytest.param(
        BlockCase(EMPTY, Release.AFTER_GRACE, Reason.EMPTY_BLOCK, first_empty=None, now=T0),
        id="first-observation-starts-timer",
    ),
    pytest.param(
        BlockCase(EMPTY, Release.NOW, Reason.EMPTY_BLOCK, affine_blocks=5),
        id="other-blocks-full-still-released",
    ),
    pytest.param(
        BlockCase(EMPTY, Release.NEVER, Reason.LAST_BLOCK, affine_blocks=1, now=T0 + 100 * LGP),
        id="never-a-live-nodes-last-block",
    ),
    pytest.param(
        BlockCase(EMPTY, Release.NEVER, Reason.BLOCK_GC_DISABLED, grace=None), id="lgp-unset-block-gc-off"
    ),
    pytest.param(
        BlockCase(EMPTY, Release.NEVER, Reason.BLOCK_GC_DISABLED, grace=0.0), id="lgp-0-block-gc-off"
    ),
    pytest.param(
        BlockCase(EMPTY, Release.NEVER, Reason.NODE_MIGRATING, labels={MIGRATION: "flannel"}),
        id="flannel-migration-in-progress",
    ),
    pytest.param(
        BlockCase(EMPTY, Release.NEVER, Reason.NODE_MIGRATING, labels={MIGRATION: ""}),
        id="flannel-migration-label-empty",
    ),
    pytest.param(
        BlockCase(EMPTY, Release.NOW, Reason.EMPTY_BLOCK, labels={MIGRATION: "calico"}),
        id="flannel-migration-done-calico",
    ),
    pytest.param(
        BlockCase(EMPTY, Release.NOW, Reason.EMPTY_BLOCK, labels={"other": "flannel"}), id="unrelated-label"
    ),
    # a deleted node that is releasable takes its empty blocks with its affinities, at once
    *(
        pytest.param(
            BlockCase(
                EMPTY,
                Release.NOW,
                Reason.NODE_MISSING,
                node_exists=False,
                node_releasable=True,
                affine_blocks=n,
                grace=g,
                first_empty=None,
                now=T0,
            ),
            id=f"deleted-node-empty-block-now-grace-{g}-blocks-{n}",
        )
        for g, n in ((None, 1), (0.0, 1), (LGP, 2))
    ),
    pytest.param(
        BlockCase(EMPTY, Release.NEVER, Reason.LAST_BLOCK, node_exists=False, affine_blocks=1),
        id="deleted-node-not-releasable-last-block",
    ),
    pytest.param(
        BlockCase(EMPTY, Release.NOW, Reason.EMPTY_BLOCK, node_exists=False),
        id="deleted-node-not-releasable-after-grace",
    ),
    # only empty host-affine blocks are considered at all
    pytest.param(BlockCase(_block(affinity="virtual:load-balancer"), None), id="virtual-affinity"),
    pytest.param(BlockCase(_block(affinity=None), None), id="unaffine"),
    pytest.param(
        BlockCase(_block(affinity=None), None, node_exists=False, node_releasable=True), id="unaffine-gone"
    ),
    pytest.param(BlockCase(_block(used={5: POD_ATTR}), None), id="non-empty"),
    pytest.param(BlockCase(_block(used={0: WINDOWS_ATTR, 1: WINDOWS_ATTR}), None), id="windows-reserved"),
    pytest.param(
        BlockCase(_block(used={0: WINDOWS_ATTR}), None, node_exists=False, node_releasable=True),
        id="windows-reserved-gone-node",
    ),
    pytest.param(BlockCase(_block(used={7: COOLDOWN_ATTR}), None), id="cooldown-ordinal"),
    pytest.param(
        BlockCase(_block("10.244.9.7/32"), Release.NOW, Reason.EMPTY_BLOCK), id="small-slash-32-block"
    ),
    pytest.param(BlockCase(_block("fd00:10:244::40/122"), Release.NOW, Reason.EMPTY_BLOCK), id="ipv6-block"),
]


@pytest.mark.parametrize("case", BLOCK_CASES)
def test_evaluate_empty_block(case: BlockCase) -> None:
    ev = evaluate_empty_block(
        case.block,
        case.node_exists,
        case.node_releasable,
        case.labels,
        case.affine_blocks,
        case.grace,
        case.first_empty,
        case.now,
    )
    if case.release is None:
        assert ev is None
        return
    assert ev is not None
    assert (ev.block, ev.node) == (case.block.cidr_str, N1)
    assert (ev.release, ev.reason) == (case.release, case.reason)


# An unaffine block its releases leave with nothing but Windows-reserved ordinals is deleted with the last
# of them (§3.13, libcalico-go `releaseIPsFromBlock`: `b.empty() && b.Affinity == nil`).
WIN_AND_POD = {0: WINDOWS_ATTR, 1: WINDOWS_ATTR, 2: WINDOWS_ATTR, 63: WINDOWS_ATTR, 5: POD_ATTR}
WIN_UPPER = {**WINDOWS_ATTR, "handle_id": "Windows-Reserved-IPAM-Handle"}
NOW, LATER, NEVER = Release.NOW, Release.AFTER_GRACE, Release.NEVER


@pytest.mark.parametrize(
    ("block", "releases", "fate"),
    [
        pytest.param(_block(affinity=None, used=WIN_AND_POD), {5: NOW}, NOW, id="reserved-left-now"),
        pytest.param(_block(affinity=None, used=WIN_AND_POD), {5: LATER}, LATER, id="reserved-left-later"),
        pytest.param(_block(affinity=None, used=WIN_AND_POD), {5: NEVER}, None, id="ip-kept"),
        pytest.param(_block(affinity=None, used=WIN_AND_POD), {}, None, id="no-verdict-kept"),
        pytest.param(_block(affinity=None, used={0: WIN_UPPER, 5: POD_ATTR}), {5: NOW}, NOW, id="any-case"),
        pytest.param(
            _block(affinity=None, used={5: POD_ATTR, 6: POD_ATTR}), {5: NOW, 6: LATER}, LATER, id="latest"
        ),
        pytest.param(
            _block(affinity=None, used={5: POD_ATTR, 7: COOLDOWN_ATTR}), {5: NOW}, None, id="cooling"
        ),
        pytest.param(_block(affinity=None, used={0: WINDOWS_ATTR}), {}, None, id="only-reserved-left-alone"),
        pytest.param(_block(affinity=None), {}, None, id="empty-left-alone"),
        pytest.param(_block(used=WIN_AND_POD), {5: NOW}, None, id="host-affine"),
        pytest.param(
            _block(affinity="virtual:load-balancer", used=WIN_AND_POD), {5: NOW}, None, id="virtual"
        ),
    ],
)
def test_evaluate_unaffine_block(
    block: IPAMBlock, releases: dict[int, Release], fate: Release | None
) -> None:
    ev = evaluate_unaffine_block(block, releases)
    if fate is None:
        assert ev is None
        return
    assert ev is not None
    assert (ev.block, ev.node, ev.release, ev.reason) == (block.cidr_str, "", fate, Reason.UNAFFINE_BLOCK)


def test_empty_block_needs_two_observations_more_than_grace_apart() -> None:
    first = evaluate_empty_block(EMPTY, True, False, {}, 2, LGP, None, T0)
    assert first is not None
    assert (first.release, first.first_empty) == (Release.AFTER_GRACE, T0)
    same = evaluate_empty_block(EMPTY, True, False, {}, 2, LGP, first.first_empty, T0 + LGP)
    assert same is not None
    assert (same.release, same.first_empty) == (Release.AFTER_GRACE, T0)
    later = evaluate_empty_block(EMPTY, True, False, {}, 2, LGP, first.first_empty, T0 + LGP + 0.001)
    assert later is not None
    assert later.release is Release.NOW


def test_migrating_node_clears_the_empty_timer() -> None:
    ev = evaluate_empty_block(EMPTY, True, False, {MIGRATION: "flannel"}, 2, LGP, T0, T0 + 2 * LGP)
    assert ev is not None
    assert (ev.release, ev.first_empty) == (Release.NEVER, None)
