"""Properties of the validity rules that must hold for every input, not only the catalogued ones.

(a) An IP that an existing, non-terminal pod reports is never released, whatever the allocation's `node`
    attribute (#12257), the node's existence, the grace period and the timers.
(b) Nothing is confirmed on a live node before its grace period has passed (strictly).
(c) A handle with any valid IP releases none of its IPs (#5044).
(d) Verdicts do not depend on the order in which a node's allocations are given.

Each is checked on the pure rules (`evaluate_node`, `handle_release`) and, where it applies, end to end
through `audit` on an inventory built the way Calico's CNI plugin writes IPAM data (`ClusterBuilder`).
"""

from __future__ import annotations

import ipaddress
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from lab.cluster.objects import ClusterBuilder, node_object, pod_object
from shared.audit import AuditReport, audit
from shared.model import Allocation, AllocationID, Pod
from shared.rules import NodeVerdict, evaluate_node, handle_release
from shared.snapshot import build_inventory
from shared.verdicts import AllocationType, KubeVirtView, LeakState, Lookup, PodView, Release

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


# ----------------------------------------------------------------------------------------------------
# (a) a reported IP of a live pod is never released


@SETTINGS
@given(data=st.data(), scene=node_scenes(), ip_index=st.integers(0, 63), v6=st.booleans())
def test_a_ip_reported_by_a_live_pod_is_never_released(
    data: st.DataObject, scene: NodeScene, ip_index: int, v6: bool
) -> None:
    ip = (V6 if v6 else V4).network_address + ip_index
    assume(all(a.ip != str(ip) for a in scene.allocations))
    handle = data.draw(st.sampled_from(HANDLES), label="handle")
    name = data.draw(st.sampled_from(POD_NAMES), label="pod")
    target = _alloc(ip, handle, {"node": scene.node, "namespace": NS, "pod": name, "timestamp": "t"})
    others = [data.draw(st.sampled_from((str(ip), "10.244.9.9", "fd00:10:244:9::9"))) for _ in range(2)]
    reported = [*others, data.draw(_spellings(ip), label="spelling")]
    reported = data.draw(st.permutations(reported), label="reported")
    owner = Pod(
        namespace=NS,
        name=name,
        node_name=data.draw(st.sampled_from((*NODES, "")), label="pod node"),
        phase=data.draw(st.sampled_from(NON_TERMINAL_PHASES), label="phase"),
        reason=data.draw(st.sampled_from(("", "Evicted")), label="reason"),
        pod_ip=data.draw(st.sampled_from(("", *reported)), label="podIP"),
        pod_ips=tuple(reported),
        annotations=data.draw(
            st.dictionaries(
                st.sampled_from(("cni.projectcalico.org/podIP", "vpc.amazonaws.com/pod-ips", "x/y")),
                st.sampled_from(("10.244.1.5/32", str(ip))),
                max_size=2,
            ),
            label="annotations",
        ),
        deletion_timestamp=data.draw(st.booleans(), label="deleting"),
    )
    assert not _finished(owner)
    pods = {**scene.pods, (NS, name): owner}
    allocations = data.draw(st.permutations([*scene.allocations, target]), label="order")
    timers = dict(scene.timers)
    timers[target.id] = data.draw(st.floats(min_value=0, max_value=scene.now), label="first seen")

    nv = evaluate_node(
        scene.node,
        scene.node_exists,
        allocations,
        _lookup_in(pods),
        timers,
        scene.grace,
        scene.now,
        scene.kubevirt,
    )
    (verdict,) = [v for v in nv.verdicts if v.allocation.id == target.id]
    assert verdict.valid
    assert verdict.state is LeakState.VALID
    assert verdict.first_seen is None
    states = [v.state for v in nv.verdicts if v.allocation.handle == handle]
    assert handle_release(states) is Release.NEVER
    if not scene.node_exists:
        assert not nv.releasable  # a node still holding a live pod's IP is never cleaned up


# ----------------------------------------------------------------------------------------------------
# (b) nothing is confirmed on a live node before the grace period has passed


@SETTINGS
@given(data=st.data(), scene=node_scenes(node_exists=True))
def test_b_nothing_confirmed_on_a_live_node_within_grace(data: st.DataObject, scene: NodeScene) -> None:
    grace = scene.grace if scene.grace is not None else data.draw(st.floats(0, 7200), label="grace")
    timers: dict[AllocationID, float] = {}
    for a in scene.allocations:
        if data.draw(st.booleans(), label="has timer"):
            within = st.floats(min_value=-100, max_value=grace, allow_nan=False)
            elapsed = data.draw(st.one_of(st.just(grace), within), label="elapsed")  # boundary included
            first = scene.now - elapsed
            assume(scene.now - first <= grace)
            timers[a.id] = first
    # Only the drawn grace bounds the timers: with an unset grace, VM allocations still wait their own
    # 5-minute floor, which a timer drawn within `grace` may already have passed.
    for g in (grace,):
        nv = evaluate_node(
            scene.node, True, scene.allocations, scene.lookup, timers, g, scene.now, scene.kubevirt
        )
        assert not nv.releasable
        for v in nv.verdicts:
            assert v.state is not LeakState.CONFIRMED, v
            if v.state is LeakState.CANDIDATE:
                assert v.first_seen == timers.get(v.allocation.id, scene.now)
            assert handle_release([v.state]) is not Release.NOW


@SETTINGS
@given(scene=node_scenes(node_exists=True, min_size=1), elapsed=st.floats(0, 1e6), grace=graces)
def test_b_a_candidate_is_confirmed_exactly_when_its_grace_has_passed(
    scene: NodeScene, elapsed: float, grace: float | None
) -> None:
    """The other half: on a live node, a non-VM leak is confirmed iff grace > 0 and elapsed > grace."""
    first = scene.now - elapsed
    timers = {a.id: first for a in scene.allocations}
    nv = evaluate_node(
        scene.node, True, scene.allocations, scene.lookup, timers, grace, scene.now, scene.kubevirt
    )
    for v in nv.verdicts:
        if v.valid or v.type is not AllocationType.POD:
            continue
        if grace is None:
            assert v.state is LeakState.IGNORED
        elif grace > 0 and scene.now - first > grace:
            assert v.state is LeakState.CONFIRMED
        else:
            assert v.state is LeakState.CANDIDATE


# ----------------------------------------------------------------------------------------------------
# (c) a handle with any valid IP releases none of its IPs


@SETTINGS
@given(data=st.data(), grace=graces, now=times)
def test_c_handle_with_a_valid_ip_releases_nothing(
    data: st.DataObject, grace: float | None, now: float
) -> None:
    """One handle's IPs spread over up to three nodes (dual-stack, KubeVirt live migration); one is valid."""
    handle = "k8s-pod-network.shared"
    ips = data.draw(addresses(min_size=2, max_size=6), label="ips")
    states: list[LeakState] = []
    valid_ip = data.draw(st.sampled_from(ips), label="valid ip")
    for node in NODES:
        mine = [ip for i, ip in enumerate(ips) if NODES[i % len(NODES)] == node]
        if not mine:
            continue
        allocations = []
        pods: dict[tuple[str, str], PodView] = {}
        for ip in mine:
            # One pod per IP: a name from the IP's value could repeat (10.244.1.4 and fd00::…04 share
            # `int(ip) % 1000`), and the valid IP's pod would then be replaced by another drawn pod.
            name = f"p-{ips.index(ip)}"
            allocations.append(_alloc(ip, handle, {"node": node, "namespace": NS, "pod": name}))
            if ip == valid_ip:
                pods[(NS, name)] = Pod(
                    NS, name, node_name=node, phase="Running", pod_ip=str(ip), pod_ips=(str(ip),)
                )
            else:
                pods[(NS, name)] = data.draw(pod_views(name, mine), label="pod")
        exists = data.draw(st.booleans(), label="node exists")
        timers = {a.id: data.draw(st.floats(0, now), label="first") for a in allocations}
        lookup = _lookup_in(pods)
        nv = evaluate_node(node, exists, allocations, lookup, timers, grace, now)
        states.extend(v.state for v in nv.verdicts)
    assert LeakState.VALID in states
    assert handle_release(states) is Release.NEVER


# ----------------------------------------------------------------------------------------------------
# (d) verdicts never depend on the order of a node's allocations


def _verdict_map(nv: NodeVerdict) -> dict[AllocationID, tuple[Any, ...]]:
    return {v.allocation.id: (v.type, v.valid, v.reason, v.state, v.first_seen) for v in nv.verdicts}


@SETTINGS
@given(data=st.data(), scene=node_scenes())
def test_d_verdicts_do_not_depend_on_allocation_order(data: st.DataObject, scene: NodeScene) -> None:
    shuffled = data.draw(st.permutations(scene.allocations), label="order")
    first, second = scene.evaluate(), scene.evaluate(allocations=shuffled)
    assert len(first.verdicts) == len(second.verdicts) == len(scene.allocations)
    assert _verdict_map(first) == _verdict_map(second)
    assert first.releasable is second.releasable
    reversed_ = scene.evaluate(allocations=tuple(reversed(scene.allocations)))
    assert _verdict_map(first) == _verdict_map(reversed_)
    assert first.releasable is reversed_.releasable


# ----------------------------------------------------------------------------------------------------
# The same properties end to end: IPAM data as Calico's CNI writes it, audited from a snapshot


@dataclass(frozen=True)
class Workload:
    name: str
    attr_node: str  # what the CNI wrote into the allocation's `node` attribute
    pod_node: str  # where the pod runs ("" = not scheduled)
    dual_stack: bool
    exists: bool
    phase: str
    report: str  # "all" | "v4" | "none"
    deleting: bool


workloads = st.builds(
    Workload,
    name=st.just(""),
    attr_node=st.sampled_from(NODES),
    pod_node=st.sampled_from((*NODES, "")),
    dual_stack=st.booleans(),
    exists=st.booleans(),
    phase=st.sampled_from(ALL_PHASES),
    report=st.sampled_from(("all", "v4", "none")),
    deleting=st.booleans(),
)


@dataclass
class Cluster:
    report: AuditReport
    live_ips: set[str]  # IPs a live, non-terminal pod reports
    live_nodes: set[str]


@st.composite
def clusters(draw: st.DrawFn) -> Cluster:
    cb = ClusterBuilder()
    live_nodes = set(draw(st.lists(st.sampled_from(NODES), unique=True, min_size=1)))
    for node in NODES:
        cb.nodes[node] = node_object(node)
        if draw(st.booleans()):
            cb.add_tunnel(node, draw(st.sampled_from(TUNNEL_TYPES)))
    live_ips: set[str] = set()
    for i, w in enumerate(draw(st.lists(workloads, max_size=8))):
        name = f"w-{i}"
        _, ips = cb.cni_add(NS, name, w.attr_node, dual_stack=w.dual_stack)
        if not w.exists:
            continue
        shown = {"all": ips, "v4": ips[:1], "none": []}[w.report]
        spelled = [draw(_spellings(ipaddress.ip_address(ip))) for ip in shown]
        annotations = {"cni.projectcalico.org/podIP": f"{ips[0]}/32"} if draw(st.booleans()) else {}
        obj = pod_object(NS, name, w.pod_node, spelled, w.phase, annotations=annotations)
        if w.deleting:
            obj["metadata"]["deletionTimestamp"] = "2025-01-21T18:00:00Z"
        cb.pods[(NS, name)] = obj
        if w.phase not in ("Succeeded", "Failed", "Completed"):
            live_ips.update(shown)
    if draw(st.booleans()):
        cb.ipam.claim_block(draw(st.sampled_from(NODES)))
    for node in set(NODES) - live_nodes:
        cb.delete_node(node)
    grace = draw(graces)
    inv = build_inventory(cb.snapshot()["items"])
    assert not inv.skipped
    return Cluster(audit(inv, grace), live_ips, live_nodes)


@SETTINGS
@given(cluster=clusters())
def test_a_audit_never_releases_an_ip_a_live_pod_reports(cluster: Cluster) -> None:
    rows = {r.verdict.allocation.ip: r for r in cluster.report.rows}
    for ip in cluster.live_ips:
        assert rows[ip].verdict.valid, rows[ip]
        assert rows[ip].release is Release.NEVER


@SETTINGS
@given(cluster=clusters())
def test_b_audit_releases_nothing_on_a_live_node_now(cluster: Cluster) -> None:
    for r in cluster.report.rows:
        if r.verdict.allocation.node in cluster.live_nodes:
            assert r.verdict.state is not LeakState.CONFIRMED
            assert r.release is not Release.NOW
    for e in cluster.report.empty_blocks:
        if e.node in cluster.live_nodes:
            assert e.release is not Release.NOW  # no timers in a one-shot audit: never two observations


@SETTINGS
@given(cluster=clusters())
def test_c_audit_handle_with_a_valid_ip_releases_nothing(cluster: Cluster) -> None:
    by_handle: dict[str, list[Any]] = defaultdict(list)
    for r in cluster.report.rows:
        by_handle[r.verdict.allocation.handle].append(r)
    for rows in by_handle.values():
        if any(r.verdict.valid for r in rows):
            assert {r.release for r in rows} == {Release.NEVER}
        releases = {r.release for r in rows}
        assert len(releases) == 1, rows  # all-or-none: one decision per handle
    summary = cluster.report.summary
    assert summary["allocations"] == summary["in_use"] + summary["leaked"] == len(cluster.report.rows)
