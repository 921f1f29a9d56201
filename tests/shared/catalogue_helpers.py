"""What the rule catalogue's modules share: the names and times of its scenarios, the builders of
allocations, pods and blocks, and the row type of one node's pass.

The catalogue (`test_rules_catalogue_*.py`) checks the validity rules row by row against Calico's behaviour
(`calico-ipam-gc.md` §3.6–§3.10, §4, §8, §10): every row of the §4 summary table, every item of Calico's own
test catalogue (§10) that can be decided without a live system, and the §8 edge cases 1, 2, 3, 12–18 and 22.
Calico's decision is the expected one, except for the deliberately fixed bug #12257 (PR #13538): a pod that
reports the allocation IP keeps it, whatever the allocation's `node` attribute says.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.blockops import new_block_object
from shared.model import Allocation, AllocationID, IPAMBlock, Pod
from shared.parse import parse_block
from shared.rules import NodeVerdict, evaluate_node
from shared.verdicts import KubeVirtView, LeakState, Lookup, PodView, Reason, Verdict

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


V6 = "fd00:10:244::5"
VMS = KubeVirtView(vms=frozenset({(NS, "vm-0")}), vmis_owned_by_vm={})


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


def check_node_case(case: NodeCase) -> None:
    """`test_evaluate_node`'s checks of one row (its rows are split by whether the node exists)."""
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
