"""A cluster inventory built from raw objects (a `kubectl get -o json` List, or any object source).

Malformed objects are collected, not raised, and they keep what might depend on them: a pod that cannot
be parsed is treated as existing (its allocations stay valid; one whose only fault is an IP that does
not parse is kept with its IPs unparsed, for the rules to judge as Calico does), a node likewise, and
any handle named in an unparsable block is held so handle all-or-none never releases its other IPs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shared import kubevirt as kv
from shared.errors import BadPodIP, MalformedObject
from shared.model import BlockAffinity, IPAMBlock, IPAMHandle, Node, Pod
from shared.parse import parse_affinity, parse_block, parse_handle, parse_node, parse_pod

# kind → (apiVersion group prefix accepted). Items of other kinds are ignored.
KINDS = ("Node", "Pod", "IPAMBlock", "IPAMHandle", "BlockAffinity", kv.VM_KIND, kv.VMI_KIND)


@dataclass(frozen=True, slots=True)
class Skipped:
    kind: str
    name: str
    reason: str

    def __str__(self) -> str:
        return f"skipped {self.kind}/{self.name or '<unnamed>'}: {self.reason}"


@dataclass(slots=True)
class Inventory:
    nodes: dict[str, Node] = field(default_factory=dict)
    pods: dict[tuple[str, str], Pod] = field(default_factory=dict)
    blocks: dict[str, IPAMBlock] = field(default_factory=dict)  # by CIDR string
    handles: dict[str, IPAMHandle] = field(default_factory=dict)  # by object name
    affinities: dict[str, BlockAffinity] = field(default_factory=dict)  # by object name
    # Objects we could not trust, and what they make ambiguous.
    skipped: list[Skipped] = field(default_factory=list)
    unknown_pods: set[tuple[str, str]] = field(default_factory=set)
    unknown_nodes: set[str] = field(default_factory=set)
    pods_complete: bool = True  # False when a pod without a readable identity was skipped
    nodes_complete: bool = True
    held_handles: set[str] = field(default_factory=set)
    held_nodes: set[str] = field(default_factory=set)  # named by an unparsable block: never "drained"
    kinds_seen: set[str] = field(default_factory=set)
    # KubeVirt (kubevirt.io/v1): its VMs and VMIs, and those that could not be read (their VM allocations
    # are kept, `vm-unknown`); `kubevirt_complete` is False when one without a readable identity was skipped.
    vms: dict[tuple[str, str], kv.VirtualMachine] = field(default_factory=dict)
    vmis: dict[tuple[str, str], kv.VirtualMachineInstance] = field(default_factory=dict)
    unknown_vms: set[tuple[str, str]] = field(default_factory=set)
    kubevirt_complete: bool = True

    @property
    def has_kubevirt(self) -> bool:
        """The snapshot holds kubevirt.io objects: KubeVirt counts as installed."""
        return bool({kv.VM_KIND, kv.VMI_KIND} & self.kinds_seen)


def _identity(raw: Mapping[str, Any]) -> tuple[str, str]:
    meta = raw.get("metadata")
    if not isinstance(meta, Mapping):
        return "", ""
    name = meta.get("name")
    ns = meta.get("namespace")
    return (ns if isinstance(ns, str) else "", name if isinstance(name, str) else "")


def _owners_in(raw: Mapping[str, Any]) -> tuple[set[str], set[str]]:
    """Best effort: the handles and nodes an unparsable block mentions."""
    spec = raw.get("spec")
    if not isinstance(spec, Mapping):
        return set(), set()
    handles: set[str] = set()
    nodes: set[str] = set()
    affinity = spec.get("affinity")
    if isinstance(affinity, str) and affinity.startswith("host:"):
        nodes.add(affinity[len("host:") :])
    attrs = spec.get("attributes")
    if isinstance(attrs, list):
        for a in attrs:
            if not isinstance(a, Mapping):
                continue
            if isinstance(a.get("handle_id"), str):
                handles.add(a["handle_id"])
            secondary = a.get("secondary")
            if isinstance(secondary, Mapping) and isinstance(secondary.get("node"), str):
                nodes.add(secondary["node"])
    return handles, nodes


def add_object(inv: Inventory, raw: object) -> None:
    """Parse one raw object into the inventory (malformed ones are recorded in `inv.skipped`)."""
    if not isinstance(raw, Mapping):
        inv.skipped.append(Skipped("<unknown>", "", "list item is not a JSON object"))
        return
    kind = raw.get("kind")
    if kind not in KINDS:
        return
    assert isinstance(kind, str)
    inv.kinds_seen.add(kind)
    try:
        if kind == "Node":
            node = parse_node(raw)
            inv.nodes[node.name] = node
        elif kind == "Pod":
            pod = parse_pod(raw)
            inv.pods[pod.key] = pod
        elif kind == "IPAMBlock":
            block = parse_block(raw)
            if not block.deleted:  # a soft-deleted block is absent to every reader
                inv.blocks[block.cidr_str] = block
        elif kind == "IPAMHandle":
            handle = parse_handle(raw)
            inv.handles[handle.name] = handle
        elif kind == kv.VM_KIND:
            vm = kv.parse_vm(raw)
            inv.vms[(vm.namespace, vm.name)] = vm
        elif kind == kv.VMI_KIND:
            vmi = kv.parse_vmi(raw)
            inv.vmis[(vmi.namespace, vmi.name)] = vmi
        else:
            affinity = parse_affinity(raw)
            inv.affinities[affinity.name] = affinity
    except MalformedObject as exc:
        ns, name = _identity(raw)
        inv.skipped.append(Skipped(kind, f"{ns}/{name}" if ns else name, f"{exc.code}: {exc.detail}"))
        if isinstance(exc, BadPodIP) and isinstance(exc.pod, Pod):
            inv.pods[exc.pod.key] = exc.pod  # judged with its IPs unparsed, as Calico does
            return
        if kind == "Pod":
            if ns and name:
                inv.unknown_pods.add((ns, name))
            else:
                inv.pods_complete = False
        elif kind == "Node":
            if name:
                inv.unknown_nodes.add(name)
            else:
                inv.nodes_complete = False
        elif kind == "IPAMBlock":
            handles, nodes = _owners_in(raw)
            inv.held_handles |= handles
            inv.held_nodes |= nodes
        elif kind in (kv.VM_KIND, kv.VMI_KIND):
            if ns and name:
                inv.unknown_vms.add((ns, name))
            else:
                inv.kubevirt_complete = False


def build_inventory(items: Iterable[object]) -> Inventory:
    inv = Inventory()
    for raw in items:
        add_object(inv, raw)
    return inv
