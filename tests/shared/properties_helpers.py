"""What the validity rules' property tests (`test_rules_properties*.py`) share: the hypothesis settings, the
names, addresses, phases and annotations they draw from, and the strategies of one node's scene."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st

from shared.model import Allocation, AllocationID, Pod
from shared.rules import NodeVerdict, evaluate_node
from shared.verdicts import KubeVirtView, Lookup, PodView

SETTINGS = settings(max_examples=200, deadline=None, database=None)

NODES = ("node-1", "node-2", "node-3")
NS = "default"
POD_NAMES = ("web-0", "web-1", "web-2", "web-3")
VM_NAMES = ("vm-0", "vm-1")
HANDLES = tuple(f"k8s-pod-network.h{i}" for i in range(4))
V4 = ipaddress.ip_network("10.244.1.0/26")
V6 = ipaddress.ip_network("fd00:10:244::/122")
TUNNEL_TYPES = (
    "ipipTunnelAddress",
    "vxlanTunnelAddress",
    "vxlanV6TunnelAddress",
    "wireguardTunnelAddress",
    "wireguardV6TunnelAddress",
)
NON_TERMINAL_PHASES = ("Running", "Pending", "Unknown", "")
ALL_PHASES = (*NON_TERMINAL_PHASES, "Succeeded", "Failed", "Completed")

# Pod IP annotations: blanked by Calico/AWS CNI on teardown, or carrying IPs (status wins when it has any).
ANNOTATION_SETS: tuple[dict[str, str], ...] = (
    {},
    {"cni.projectcalico.org/podIP": ""},
    {"vpc.amazonaws.com/pod-ips": ""},
    {"cni.projectcalico.org/podIPs": ""},
    {"cni.projectcalico.org/podIP": "10.244.1.5/32"},
    {"cni.projectcalico.org/podIPs": "10.244.1.5/32,fd00:10:244::5/128", "cni.projectcalico.org/podIP": ""},
    {"vpc.amazonaws.com/pod-ips": "10.244.1.5"},
)

graces = st.one_of(st.none(), st.just(0.0), st.floats(min_value=0.001, max_value=7200, allow_nan=False))
times = st.floats(min_value=0, max_value=1e7, allow_nan=False)


# ----------------------------------------------------------------------------------------------------
# strategies over the pure rules


def _spellings(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> st.SearchStrategy[str]:
    """Ways a pod status (or annotation) may spell `ip`; all equal to it once parsed."""
    if ip.version == 4:
        return st.sampled_from([str(ip), f"{ip}/32", f"::ffff:{ip}", f"::FFFF:{ip}"])
    return st.sampled_from([str(ip), ip.exploded, str(ip).upper(), ip.exploded.upper(), f"{ip}/128"])


def _alloc(
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address, handle: str, attrs: Mapping[str, str]
) -> Allocation:
    net = V4 if ip.version == 4 else V6
    return Allocation(
        ip=str(ip),
        ordinal=int(ip) - int(net.network_address),
        block=str(net),
        handle=handle,
        attrs=dict(attrs),
        sequence_number=1,
    )


@st.composite
def addresses(draw: st.DrawFn, min_size: int = 0, max_size: int = 6) -> list[Any]:
    picks = draw(
        st.lists(
            st.tuples(st.sampled_from((V4, V6)), st.integers(0, 63)),
            unique=True,
            min_size=min_size,
            max_size=max_size,
        )
    )
    return [net.network_address + o for net, o in picks]


@st.composite
def allocation_for(draw: st.DrawFn, ip: Any, node: str) -> Allocation:
    """Any kind of allocation the GC tracks on `node` (the node attribute is the node it is listed under)."""
    kind = draw(st.sampled_from(("pod", "pod", "pod", "vm", "tunnel", "unknown", "reserved", "no-pod-attr")))
    handle = draw(st.sampled_from(HANDLES))
    if kind == "pod":
        return _alloc(ip, handle, {"node": node, "namespace": NS, "pod": draw(st.sampled_from(POD_NAMES))})
    if kind == "vm":
        vm = draw(st.sampled_from(VM_NAMES))
        attrs = {"node": node, "namespace": NS, "pod": f"virt-launcher-{vm}", "vmi-name": vm}
        return _alloc(ip, f"k8s-pod-network.vmi.{NS}.{vm}", attrs)
    if kind == "tunnel":
        t = draw(st.sampled_from(TUNNEL_TYPES))
        return _alloc(ip, f"{t}-{node}", {"node": node, "type": t})
    if kind == "unknown":
        return _alloc(ip, "lb-abc", {"node": node, "service": "ingress", "namespace": NS})
    if kind == "reserved":
        return _alloc(ip, "windows-reserved-ipam-handle", {"node": node, "note": "windows host rsvd"})
    return _alloc(ip, handle, {"node": node, "namespace": NS})


@st.composite
def pod_views(draw: st.DrawFn, name: str, ips: list[Any]) -> PodView:
    choice = draw(st.sampled_from(("pod", "pod", "pod", "missing", "unknown")))
    if choice == "missing":
        return Lookup.MISSING
    if choice == "unknown":
        return Lookup.UNKNOWN
    reported = draw(st.lists(st.sampled_from(ips), unique=True, max_size=3)) if ips else []
    texts = [draw(_spellings(ip)) for ip in reported]
    if draw(st.booleans()):
        texts.append(draw(st.sampled_from(("10.244.9.9", "fd00:10:244:9::9"))))
    pod_ip = draw(st.sampled_from(("first", "empty", "other"))) if texts else "empty"
    annotations = draw(st.sampled_from(ANNOTATION_SETS))
    return Pod(
        namespace=NS,
        name=name,
        node_name=draw(st.sampled_from((*NODES, ""))),
        phase=draw(st.sampled_from(ALL_PHASES)),
        reason=draw(st.sampled_from(("", "Evicted"))),
        pod_ip={"first": texts[0] if texts else "", "empty": "", "other": "10.244.9.8"}[pod_ip],
        pod_ips=tuple(texts),
        annotations=annotations,
        deletion_timestamp=draw(st.booleans()),
    )


@st.composite
def kubevirt_views(draw: st.DrawFn) -> KubeVirtView | Lookup | None:
    choice = draw(st.sampled_from(("view", "view", "absent", "error")))
    if choice == "absent":
        return None
    if choice == "error":
        return Lookup.UNKNOWN
    vms = draw(st.frozensets(st.sampled_from(VM_NAMES)))
    vmis = draw(st.dictionaries(st.sampled_from(VM_NAMES), st.booleans()))
    return KubeVirtView(frozenset((NS, v) for v in vms), {(NS, k): owned for k, owned in vmis.items()})


@dataclass(frozen=True)
class NodeScene:
    node: str
    node_exists: bool
    allocations: tuple[Allocation, ...]
    pods: Mapping[tuple[str, str], PodView]
    kubevirt: KubeVirtView | Lookup | None
    grace: float | None
    now: float
    timers: Mapping[AllocationID, float]

    def lookup(self, ns: str, name: str) -> PodView:
        return self.pods.get((ns, name), Lookup.MISSING)

    def evaluate(self, allocations: Any = None, timers: Any = None) -> NodeVerdict:
        return evaluate_node(
            self.node,
            self.node_exists,
            self.allocations if allocations is None else allocations,
            self.lookup,
            self.timers if timers is None else timers,
            self.grace,
            self.now,
            self.kubevirt,
        )


@st.composite
def node_scenes(draw: st.DrawFn, node_exists: bool | None = None, min_size: int = 0) -> NodeScene:
    node = draw(st.sampled_from(NODES))
    ips = draw(addresses(min_size=min_size))
    allocations = tuple(draw(allocation_for(ip, node)) for ip in ips)
    pods = {(NS, name): draw(pod_views(name, ips)) for name in POD_NAMES if draw(st.booleans())}
    now = draw(times)
    timers = {
        a.id: draw(st.floats(min_value=0, max_value=now, allow_nan=False))
        for a in allocations
        if draw(st.booleans())
    }
    return NodeScene(
        node=node,
        node_exists=draw(st.booleans()) if node_exists is None else node_exists,
        allocations=allocations,
        pods=pods,
        kubevirt=draw(kubevirt_views()),
        grace=draw(graces),
        now=now,
        timers=timers,
    )


def _lookup_in(pods: Mapping[tuple[str, str], PodView]) -> Callable[[str, str], PodView]:
    def lookup(ns: str, name: str) -> PodView:
        return pods.get((ns, name), Lookup.MISSING)

    return lookup


def _finished(p: Pod) -> bool:
    """Calico's IsFinished, restated for the property (terminal phase, or CNI-removed while deleting)."""
    blanked = p.annotations.get("cni.projectcalico.org/podIP") == "" or (
        p.annotations.get("vpc.amazonaws.com/pod-ips") == ""
    )
    return p.phase in ("Succeeded", "Failed", "Completed") or (p.deletion_timestamp and blanked)
