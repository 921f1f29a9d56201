"""The ground truth of a cluster as loaded: every allocation, block and affinity, and whether it is in use.

Why a module of its own: a difference between two collectors means little without knowing which of them
was right, and the truth must not come from either of them.  It is derived here from the loaded objects
alone, in plain terms a user would check by hand: a pod IP is in use when its pod exists, has not
finished and reports the IP; a tunnel IP when its node exists; a VM's IP when its VirtualMachine or its
VirtualMachineInstance exists.  Nothing here reuses ipamgc's rules (`shared/`), which are what is judged.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.calicogroup import plural_of_kind

__all__ = [
    "TUNNEL_TYPES",
    "AffinityFact",
    "AllocKey",
    "AllocationFact",
    "BlockFact",
    "ClusterFacts",
    "facts_of",
]

TUNNEL_TYPES = frozenset(
    {
        "ipipTunnelAddress",
        "vxlanTunnelAddress",
        "vxlanV6TunnelAddress",
        "wireguardTunnelAddress",
        "wireguardV6TunnelAddress",
    }
)
WINDOWS_RESERVED_HANDLE = "windows-reserved-ipam-handle"
FINISHED = frozenset({"Succeeded", "Failed"})
CNI_POD_IP = "cni.projectcalico.org/podIP"

# One allocation, as a block holds it: (block CIDR, ordinal, handle ("" for a cooling ordinal), IP).
AllocKey = tuple[str, int, str, str]

# `truth` values: `in-use`, `leaked`, `unknown` (no owner ipamgc or Calico can judge: no `node`
# attribute, an unknown source), `reserved` (Windows), `cooling` (an IP cooldown ordinal).


@dataclass(frozen=True, slots=True)
class AllocationFact:
    key: AllocKey
    node: str  # the `node` attribute ("" when absent)
    attrs: Mapping[str, str]
    truth: str
    detail: str  # why: pod-running, pod-missing, pod-on-other-node, node-missing, vm-missing, ...

    @property
    def block(self) -> str:
        return self.key[0]

    @property
    def handle(self) -> str:
        return self.key[2]

    @property
    def ip(self) -> str:
        return self.key[3]


@dataclass(frozen=True, slots=True)
class BlockFact:
    cidr: str
    node: str  # the affine node ("" for an unaffine block)
    node_exists: bool
    allocated: int  # ordinals allocated at load (cooling and reserved included)
    cooling: int  # ordinals in IP cooldown at load
    in_pool: bool  # some IPPool's CIDR holds the block (with no node selector, or `all()`)

    @property
    def version(self) -> int:
        return ipaddress.ip_network(self.cidr).version

    @property
    def truth(self) -> str:
        state = "empty" if not self.allocated else f"{self.allocated} allocated"
        owner = f"node {self.node}" if self.node else "no affinity"
        gone = "" if self.node_exists or not self.node else " (gone)"
        return f"{state}, {owner}{gone}"


@dataclass(frozen=True, slots=True)
class AffinityFact:
    name: str
    node: str
    cidr: str
    node_exists: bool
    block_exists: bool

    @property
    def truth(self) -> str:
        node = "node exists" if self.node_exists else "node gone"
        block = "block exists" if self.block_exists else "no block"
        return f"{node}, {block}"


@dataclass
class ClusterFacts:
    """What the cluster held when loaded."""

    allocations: dict[AllocKey, AllocationFact] = field(default_factory=dict)
    blocks: dict[str, BlockFact] = field(default_factory=dict)
    affinities: dict[str, AffinityFact] = field(default_factory=dict)
    nodes: set[str] = field(default_factory=set)
    pods: dict[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)
    cooldown_seconds: int = 0

    def by_handle(self, handle: str) -> list[AllocationFact]:
        return [a for a in self.allocations.values() if a.handle == handle]

    def node_blocks(self, node: str) -> list[BlockFact]:
        """The node's affine blocks, lowest-addressed first, IPv4 before IPv6."""
        blocks = [b for b in self.blocks.values() if b.node == node]
        return sorted(blocks, key=lambda b: (b.version, int(ipaddress.ip_network(b.cidr).network_address)))


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _pod_ips(pod: Mapping[str, Any]) -> tuple[list[str], bool]:
    """The IPs the pod's status reports, and whether every one of them parses."""
    status = _dict(pod.get("status"))
    raw = [str(_dict(e).get("ip", "")) for e in status.get("podIPs") or [] if isinstance(e, dict)]
    if not raw and status.get("podIP"):
        raw = [str(status["podIP"])]
    ips, ok = [], True
    for value in raw:
        try:
            ips.append(str(ipaddress.ip_address(value)))
        except ValueError:
            ok = False
    return ips, ok


def _pod_truth(
    attrs: Mapping[str, str], ip: str, pods: Mapping[tuple[str, str], Mapping[str, Any]]
) -> tuple[str, str]:
    pod = pods.get((attrs.get("namespace", ""), attrs.get("pod", "")))
    if pod is None:
        return "leaked", "pod-missing"
    status = _dict(pod.get("status"))
    meta = _dict(pod.get("metadata"))
    ips, parsed = _pod_ips(pod)
    if status.get("phase") in FINISHED:
        return "leaked", "pod-finished" if parsed else "pod-finished-ip-unparsable"
    if meta.get("deletionTimestamp") and _dict(meta.get("annotations")).get(CNI_POD_IP) == "":
        return "leaked", "pod-terminating-cni-del-done"
    if not parsed:
        return "unknown", "pod-ip-unparsable"
    on_node = str(_dict(pod.get("spec")).get("nodeName") or "")
    if not ips:
        return "in-use", "no-pod-ip-yet"
    if ip not in ips:
        return "leaked", "pod-ip-mismatch"
    if on_node and on_node != attrs.get("node"):
        return "in-use", "pod-on-other-node"
    return "in-use", "pod-running"


def _allocation_truth(
    attrs: Mapping[str, str],
    ip: str,
    nodes: set[str],
    pods: Mapping[tuple[str, str], Mapping[str, Any]],
    vms: set[tuple[str, str]],
) -> tuple[str, str]:
    if "releasedAt" in attrs and not attrs.get("handle_id"):
        return "cooling", "ip-cooldown"
    if attrs.get("handle_id") == WINDOWS_RESERVED_HANDLE:
        return "reserved", "windows-reserved"
    node = attrs.get("node", "")
    if not node:
        return "unknown", "no-node-attribute"
    if attrs.get("type") in TUNNEL_TYPES:
        return ("in-use", "tunnel-node-exists") if node in nodes else ("leaked", "node-missing")
    if attrs.get("vmi-name"):
        if (attrs.get("namespace", ""), attrs["vmi-name"]) in vms:
            return "in-use", "vm-exists"
        return "leaked", "vm-missing"
    if attrs.get("namespace") and attrs.get("pod"):
        return _pod_truth(attrs, ip, pods)
    return "unknown", "unknown-source"


def facts_of(items: Iterable[Any], cooldown_seconds: int | None = None) -> ClusterFacts:
    """The ground truth of a `kubectl get … -o json` List's items (Calico's objects of either group)."""
    out = ClusterFacts()
    blocks: list[dict[str, Any]] = []
    affinities: list[dict[str, Any]] = []
    pools: list[dict[str, Any]] = []
    vms: set[tuple[str, str]] = set()
    for item in items:
        if not isinstance(item, dict):
            continue
        kind, meta = item.get("kind"), _dict(item.get("metadata"))
        plural = plural_of_kind(kind)
        if kind == "Node":
            out.nodes.add(str(meta.get("name")))
        elif kind == "Pod":
            out.pods[(str(meta.get("namespace")), str(meta.get("name")))] = item
        elif kind == "VirtualMachine" or (
            kind == "VirtualMachineInstance" and not meta.get("ownerReferences")
        ):
            # a VM, or a standalone VMI, keeps its IP (a VMI owned by a deleted VM does not)
            vms.add((str(meta.get("namespace")), str(meta.get("name"))))
        elif plural == "ipamblocks":
            blocks.append(item)
        elif plural == "blockaffinities":
            affinities.append(item)
        elif plural == "ippools":
            pools.append(item)
        elif plural == "ipamconfigs" and cooldown_seconds is None:
            value = _dict(item.get("spec")).get("ipCooldownSeconds")
            out.cooldown_seconds = value if isinstance(value, int) else 0
    if cooldown_seconds is not None:
        out.cooldown_seconds = cooldown_seconds
    for item in blocks:
        _block_facts(out, item, pools, vms)
    for item in affinities:
        spec = _dict(item.get("spec"))
        name = str(_dict(item.get("metadata")).get("name"))
        node, cidr = str(spec.get("node") or ""), str(spec.get("cidr") or "")
        out.affinities[name] = AffinityFact(name, node, cidr, node in out.nodes, cidr in out.blocks)
    return out


def _in_pool(cidr: str, pools: list[dict[str, Any]]) -> bool:
    """Whether some IPPool holds the block and selects every node.  Without any IPPool in the input the
    sandbox makes pools for every block (`lab.compare.sandbox`), so every block is in one."""
    if not pools:
        return True
    net = ipaddress.ip_network(cidr)
    for pool in pools:
        spec = _dict(pool.get("spec"))
        try:
            pnet = ipaddress.ip_network(str(spec.get("cidr")))
        except ValueError:
            continue
        selector = str(spec.get("nodeSelector") or "all()").strip()
        if pnet.version == net.version and net.subnet_of(pnet) and selector in ("", "all()"):  # type: ignore[arg-type]
            return True
    return False


def _block_facts(
    out: ClusterFacts, item: dict[str, Any], pools: list[dict[str, Any]], vms: set[tuple[str, str]]
) -> None:
    spec = _dict(item.get("spec"))
    cidr = str(spec.get("cidr"))
    try:
        net = ipaddress.ip_network(cidr)
    except ValueError:
        return
    affinity = str(spec.get("affinity") or "")
    node = affinity.removeprefix("host:") if affinity.startswith("host:") else ""
    attributes = spec.get("attributes") or []
    allocated = cooling = 0
    for ordinal, index in enumerate(spec.get("allocations") or []):
        if not isinstance(index, int) or not 0 <= index < len(attributes):
            continue
        attr = _dict(attributes[index])
        attrs = {str(k): str(v) for k, v in _dict(attr.get("secondary")).items()}
        if attr.get("releasedAt") is not None:
            attrs["releasedAt"] = str(attr["releasedAt"])
        handle = str(attr.get("handle_id") or "")
        if handle:
            attrs["handle_id"] = handle
        ip = str(net[ordinal])
        truth, detail = _allocation_truth(attrs, ip, out.nodes, out.pods, vms)
        allocated += 1
        cooling += truth == "cooling"
        key = (cidr, ordinal, handle, ip)
        out.allocations[key] = AllocationFact(key, attrs.get("node", ""), attrs, truth, detail)
    out.blocks[cidr] = BlockFact(cidr, node, node in out.nodes, allocated, cooling, _in_pool(cidr, pools))
