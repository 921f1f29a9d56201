"""Calico's validity rules, as pure functions: data and `now` in, verdict out.

The rules decide exactly as `calico-kube-controllers`' IPAM GC (spec `calico-ipam-gc.md` §3.6–§3.10
and §4), with one deliberate difference: Calico bug #12257 (PR #13538).  When a pod's reported IPs contain
the allocation IP, the allocation is valid whatever its `node` attribute says.

Everything ambiguous resolves to *valid*: a wrong release is a duplicate IP in production, a late one is
only a leak for a little longer.  No I/O and no clock reads here; callers pass `now` (seconds, one clock).

This module holds the rules above one allocation: a node's allocations together (`evaluate_node`, whose
tunnel IPs depend on the rest), a handle's all-or-none release, and the empty and unaffine blocks.  The
per-allocation verdict is `shared.allocrules`, the pod IP evidence it weighs `shared.podips`, the
vocabulary `shared.verdicts`; each is imported from where it is defined.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from shared.allocrules import (
    allocation_validity,
    classify,
    judge,
)
from shared.model import (
    ATTR_NAMESPACE,
    ATTR_POD,
    LABEL_NODE_NETWORK_DURING_MIGRATION,
    WINDOWS_RESERVED_HANDLE,
    Allocation,
    AllocationID,
    IPAMBlock,
)
from shared.verdicts import (
    AllocationType,
    KubeVirtView,
    LeakState,
    Lookup,
    PodView,
    Reason,
    Release,
    Verdict,
)


@dataclass(frozen=True, slots=True)
class NodeVerdict:
    node: str
    node_exists: bool
    verdicts: tuple[Verdict, ...]
    # The node is gone and nothing valid or of unknown source remains on it: its tunnel IPs are
    # confirmed and its affinities can be released (Calico's `nodesToRelease`).
    releasable: bool


def evaluate_node(
    node: str,
    node_exists: bool,
    allocations: Iterable[Allocation],
    pods: Callable[[str, str], PodView],
    timers: Mapping[AllocationID, float],
    grace: float | None,
    now: float,
    kubevirt: KubeVirtView | Lookup | None = None,
) -> NodeVerdict:
    """Calico's per-node step of `checkAllocations` (spec §3.6) for the allocations of one node.

    `timers` maps allocation ids to the time each was first seen invalid (persisted by the caller).
    """
    knode = node if node_exists else ""
    can_delete = True
    verdicts: list[Verdict] = []
    tunnels: list[Allocation] = []
    for a in allocations:
        kind = classify(a)
        if kind is AllocationType.RESERVED:
            verdicts.append(Verdict(a, kind, True, Reason.WINDOWS_RESERVED, LeakState.VALID, None))
            continue
        if kind is AllocationType.UNKNOWN:
            can_delete = False
            verdicts.append(Verdict(a, kind, True, Reason.UNKNOWN_SOURCE, LeakState.VALID, None))
            continue
        if kind is AllocationType.TUNNEL:
            tunnels.append(a)
            continue
        ns, name = a.attrs.get(ATTR_NAMESPACE, ""), a.attrs.get(ATTR_POD, "")
        pod = pods(ns, name) if kind is AllocationType.POD and ns and name else Lookup.UNKNOWN
        validity = allocation_validity(a, knode, pod, kubevirt)
        verdict = judge(a, kind, validity, node_exists, grace, timers.get(a.id), now)
        if verdict.valid:
            can_delete = False
        verdicts.append(verdict)
    for a in tunnels:
        if node_exists:
            verdicts.append(
                Verdict(a, AllocationType.TUNNEL, True, Reason.TUNNEL_NODE_EXISTS, LeakState.VALID, None)
            )
        elif can_delete:
            start = timers.get(a.id, now)
            verdicts.append(
                Verdict(a, AllocationType.TUNNEL, False, Reason.NODE_MISSING, LeakState.CONFIRMED, start)
            )
        else:
            verdicts.append(
                Verdict(a, AllocationType.TUNNEL, False, Reason.NODE_IN_USE, LeakState.IGNORED, None)
            )
    return NodeVerdict(node, node_exists, tuple(verdicts), (not node_exists) and can_delete)


def unattributed_verdict(a: Allocation) -> Verdict:
    """An allocation without a `node` attribute: Calico never tracks it per node, never releases it."""
    return Verdict(a, classify(a), True, Reason.NO_NODE_ATTRIBUTE, LeakState.VALID, None)


def handle_release(states: Iterable[LeakState]) -> Release:
    """Handle all-or-none (#5044): a handle's IPs go only when every one of them is a leak.

    Given the leak states of *every* allocation tracked under one handle, cluster-wide: NOW when all are
    confirmed, AFTER_GRACE when all are candidates or confirmed, NEVER otherwise.
    """
    seen = False
    all_confirmed = True
    for s in states:
        seen = True
        if s is LeakState.CANDIDATE:
            all_confirmed = False
        elif s is not LeakState.CONFIRMED:
            return Release.NEVER
    if not seen:
        return Release.NEVER
    return Release.NOW if all_confirmed else Release.AFTER_GRACE


@dataclass(frozen=True, slots=True)
class EmptyBlockVerdict:
    block: str
    node: str
    release: Release
    reason: Reason
    first_empty: float | None  # when the block was first observed empty (None: timer cleared)


def evaluate_empty_block(
    block: IPAMBlock,
    node_exists: bool,
    node_releasable: bool,
    node_labels: Mapping[str, str],
    affine_blocks_of_node: int,
    grace: float | None,
    first_empty: float | None,
    now: float,
) -> EmptyBlockVerdict | None:
    """Empty affine blocks (spec §3.10, §3.11).  None when the block is not an empty `host:` block.

    A gone node that is releasable takes its empty blocks with its affinities at once.  Otherwise: never
    a node's last affine block, never while flannel migration is under way, and only once the block has
    stayed empty for longer than the grace period across two observations.  `first_empty` is the
    earlier observation; NOW means release on this pass, AFTER_GRACE means the timer runs.
    """
    node = block.host
    if node is None or not block.is_empty:
        return None
    cidr = block.cidr_str
    if not node_exists and node_releasable:
        return EmptyBlockVerdict(cidr, node, Release.NOW, Reason.NODE_MISSING, first_empty)
    if affine_blocks_of_node <= 1:
        return EmptyBlockVerdict(cidr, node, Release.NEVER, Reason.LAST_BLOCK, first_empty)
    migration = node_labels.get(LABEL_NODE_NETWORK_DURING_MIGRATION)
    if migration is not None and migration != "calico":
        return EmptyBlockVerdict(cidr, node, Release.NEVER, Reason.NODE_MIGRATING, None)
    if grace is None or grace <= 0:
        return EmptyBlockVerdict(cidr, node, Release.NEVER, Reason.BLOCK_GC_DISABLED, None)
    if first_empty is None:
        return EmptyBlockVerdict(cidr, node, Release.AFTER_GRACE, Reason.EMPTY_BLOCK, now)
    if now - first_empty > grace:
        return EmptyBlockVerdict(cidr, node, Release.NOW, Reason.EMPTY_BLOCK, first_empty)
    return EmptyBlockVerdict(cidr, node, Release.AFTER_GRACE, Reason.EMPTY_BLOCK, first_empty)


def evaluate_unaffine_block(block: IPAMBlock, releases: Mapping[int, Release]) -> EmptyBlockVerdict | None:
    """An unaffine block that releases empty is deleted with the last of them (spec §3.13: Calico's
    `releaseIPsFromBlock` deletes a block left unaffine and empty in the library's sense, so its
    Windows-reserved ordinals go with it).  `releases` maps ordinals of the block to their release.

    None unless the block is unaffine and every ordinal in use is either Windows-reserved or released
    (`now` or `after-grace`), at least one of them released: the block goes when the last one does.
    """
    if block.affinity is not None:
        return None
    fate: Release | None = None
    for ordinal, index in enumerate(block.allocations):
        if index is None:
            continue
        handle = block.attributes[index].handle_id
        if isinstance(handle, str) and handle.lower() == WINDOWS_RESERVED_HANDLE:
            continue
        release = releases.get(ordinal, Release.NEVER)
        if release is Release.NEVER:
            return None
        if fate is not Release.AFTER_GRACE:
            fate = release
    if fate is None:
        return None  # nothing released here: Calico leaves an unaffine block as it is
    return EmptyBlockVerdict(block.cidr_str, "", fate, Reason.UNAFFINE_BLOCK, None)
