"""A one-shot audit of an inventory: every allocation's verdict and every empty block's fate.

This is what `ipamgc check` prints.  It runs the same rules as the workers, with no timers: an invalid
allocation on a live node is reported as `after-grace` (the running system releases it once the grace
period has passed with no valid observation), one on a gone node as `now`.  Of a node whose blocks are all
empty, the one the running system keeps (`shared.keeper`: the lowest-addressed) is `never`, `last-block`.
An unaffine block whose releases leave nothing but Windows-reserved ordinals is listed too
(`unaffine-block`): the last release deletes it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from shared.allocrules import leak_grace
from shared.keeper import keeper_count, keeper_of
from shared.kubevirt import view_from_objects
from shared.model import Allocation, AllocationID, sanitize_handle
from shared.rules import (
    EmptyBlockVerdict,
    evaluate_empty_block,
    evaluate_node,
    evaluate_unaffine_block,
    handle_release,
    unattributed_verdict,
)
from shared.snapshot import Inventory
from shared.verdicts import AllocationType, KubeVirtView, LeakState, Lookup, PodView, Reason, Release, Verdict


@dataclass(frozen=True, slots=True)
class AuditRow:
    verdict: Verdict
    release: Release


@dataclass(frozen=True, slots=True)
class AuditReport:
    rows: tuple[AuditRow, ...]
    empty_blocks: tuple[EmptyBlockVerdict, ...]
    gone_nodes: frozenset[str] = frozenset()  # nodes named by IPAM data that no longer exist

    @property
    def summary(self) -> dict[str, int]:
        return {
            "allocations": len(self.rows),
            "in_use": sum(1 for r in self.rows if r.verdict.valid),
            "leaked": sum(1 for r in self.rows if not r.verdict.valid),
            "release_now": sum(1 for r in self.rows if r.release is Release.NOW),
            "release_after_grace": sum(1 for r in self.rows if r.release is Release.AFTER_GRACE),
        }


def kubevirt_view(inv: Inventory, installed: bool | None = None) -> KubeVirtView | Lookup | None:
    """The VM rule's view of a snapshot: None (KubeVirt absent: every VM allocation kept) unless it is
    installed (`installed`, else: the snapshot holds kubevirt.io objects); `Lookup.UNKNOWN` when an
    unidentifiable VM or VMI was skipped (every VM allocation kept, `vm-unknown`)."""
    if not (inv.has_kubevirt if installed is None else installed):
        return None
    if not inv.kubevirt_complete:
        return Lookup.UNKNOWN
    view = view_from_objects(inv.vms.values(), inv.vmis.values())
    return KubeVirtView(view.vms, view.vmis_owned_by_vm, frozenset(inv.unknown_vms))


def audit(inv: Inventory, grace: float | None, now: float = 0.0, kubevirt: bool | None = None) -> AuditReport:
    """Judge every allocation and empty block of `inv` with leak grace period `grace` (seconds).
    `kubevirt`: whether KubeVirt is installed (None: when the snapshot holds any of its objects)."""
    vm_view = kubevirt_view(inv, kubevirt)

    def pod_view(ns: str, name: str) -> PodView:
        pod = inv.pods.get((ns, name))
        if pod is not None:
            return pod
        if not inv.pods_complete or (ns, name) in inv.unknown_pods:
            return Lookup.UNKNOWN
        return Lookup.MISSING

    def node_exists(name: str) -> bool:
        return name in inv.nodes or name in inv.unknown_nodes or not inv.nodes_complete

    by_node: dict[str, list[Allocation]] = defaultdict(list)
    unattributed: list[Allocation] = []
    affine: dict[str, list[str]] = defaultdict(list)  # node → affine block CIDRs
    for cidr, block in sorted(inv.blocks.items(), key=lambda kv: (kv[1].cidr.version, kv[1].cidr)):
        if block.host is not None:
            affine[block.host].append(cidr)
        for a in block.iter_allocations():
            (by_node[a.node] if a.node else unattributed).append(a)

    verdicts: list[Verdict] = []
    releasable: dict[str, bool] = {}
    no_timers: dict[AllocationID, float] = {}
    for node in sorted(set(by_node) | set(affine)):
        exists = node_exists(node)
        nv = evaluate_node(node, exists, by_node.get(node, []), pod_view, no_timers, grace, now, vm_view)
        held = node in inv.held_nodes
        releasable[node] = nv.releasable and not held
        # A node named by an unparsable block is never known to be drained: keep its tunnel IPs.
        verdicts.extend(_hold_tunnel(v) if held else v for v in nv.verdicts)
    verdicts.extend(unattributed_verdict(a) for a in unattributed)

    def releasable_state(v: Verdict) -> LeakState:
        # A candidate whose grace period is 0 is never confirmed (Calico: GC disabled for live nodes).
        if v.state is LeakState.CANDIDATE and not leak_grace(grace, v.type is AllocationType.VM):
            return LeakState.IGNORED
        return v.state

    states: dict[str, list[LeakState]] = defaultdict(list)
    for v in verdicts:
        states[sanitize_handle(v.allocation.handle)].append(releasable_state(v))
    rows = []
    for v in verdicts:
        handle = sanitize_handle(v.allocation.handle)
        release = Release.NEVER if handle in inv.held_handles else handle_release(states[handle])
        if releasable_state(v) not in (LeakState.CANDIDATE, LeakState.CONFIRMED):
            release = Release.NEVER
        rows.append(AuditRow(v, release))

    empties: list[EmptyBlockVerdict] = []
    for node, cidrs in sorted(affine.items()):
        exists = node_exists(node)
        labels = inv.nodes[node].labels if node in inv.nodes else {}
        empty = [c for c in cidrs if inv.blocks[c].is_empty]
        keep = keeper_of(empty)
        for cidr in cidrs:
            # The keeper is judged as the leader judges it, after the node's other empty blocks are gone.
            count = keeper_count(len(cidrs), len(empty) - 1) if cidr == keep else len(cidrs)
            ev = evaluate_empty_block(
                inv.blocks[cidr], exists, releasable.get(node, False), labels, count, grace, None, now
            )
            if ev is not None:
                empties.append(ev)
    released: dict[str, dict[int, Release]] = defaultdict(dict)  # block → ordinal → its release
    for r in rows:
        released[r.verdict.allocation.block][r.verdict.allocation.ordinal] = r.release
    for cidr, block in sorted(inv.blocks.items(), key=lambda kv: (kv[1].cidr.version, kv[1].cidr)):
        unaffine = evaluate_unaffine_block(block, released.get(cidr, {}))
        if unaffine is not None:
            empties.append(unaffine)
    gone = frozenset(n for n in set(by_node) | set(affine) if n and not node_exists(n))
    return AuditReport(tuple(rows), tuple(empties), gone)


def _hold_tunnel(v: Verdict) -> Verdict:
    if v.state is LeakState.CONFIRMED and v.type is AllocationType.TUNNEL:
        return Verdict(v.allocation, v.type, False, Reason.NODE_IN_USE, LeakState.IGNORED, None)
    return v
