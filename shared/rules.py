"""Calico's validity rules, as pure functions: data and `now` in, verdict out.

This module decides exactly as `calico-kube-controllers`' IPAM GC (spec `calico-ipam-gc.md` §3.6–§3.10
and §4), with one deliberate difference: Calico bug #12257 (PR #13538).  When a pod's reported IPs contain
the allocation IP, the allocation is valid whatever its `node` attribute says.

Everything ambiguous resolves to *valid*: a wrong release is a duplicate IP in production, a late one is
only a leak for a little longer.  No I/O and no clock reads here; callers pass `now` (seconds, one clock).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum, StrEnum

from shared.model import (
    ANNOTATION_AWS_POD_IPS,
    ANNOTATION_POD_IP,
    ANNOTATION_POD_IPS,
    ATTR_NAMESPACE,
    ATTR_POD,
    ATTR_TYPE,
    ATTR_VMI_NAME,
    FINISHED_PHASES,
    LABEL_NODE_NETWORK_DURING_MIGRATION,
    TUNNEL_TYPES,
    WINDOWS_RESERVED_HANDLE,
    Allocation,
    AllocationID,
    IPAMBlock,
    Pod,
)
from shared.netaddr import AddressError, IPAddress, parse_ip

# Calico's `defaultVMRecreationGracePeriod`: VM allocations on live nodes wait at least this long.
VM_RECREATION_GRACE_SECONDS = 300.0


class AllocationType(StrEnum):
    POD = "pod"
    TUNNEL = "tunnel"
    VM = "vm"
    RESERVED = "reserved"
    UNKNOWN = "unknown"


class LeakState(StrEnum):
    VALID = "valid"  # in use, or cannot be judged
    IGNORED = "ignored"  # invalid, but not a candidate (no grace period set, or waiting on the node)
    CANDIDATE = "candidate"  # invalid on a live node, inside its grace period
    CONFIRMED = "confirmed"  # a leak: releasable once its handle is all-or-none confirmed


class Release(StrEnum):
    NOW = "now"
    AFTER_GRACE = "after-grace"
    NEVER = "never"


class Reason(StrEnum):
    """Short codes explaining a verdict; documented for operators in the README."""

    # valid
    POD_RUNNING = "pod-running"
    STALE_NODE_ATTRIBUTE = "stale-node-attribute"
    NO_POD_IP_YET = "no-pod-ip-yet"
    NO_OWNER_ATTRIBUTES = "no-owner-attributes"
    NO_NODE_ATTRIBUTE = "no-node-attribute"
    POD_UNKNOWN = "pod-unknown"
    POD_IP_UNPARSABLE = "pod-ip-unparsable"
    TUNNEL_NODE_EXISTS = "tunnel-node-exists"
    WINDOWS_RESERVED = "windows-reserved"
    UNKNOWN_SOURCE = "unknown-source"
    KUBEVIRT_ABSENT = "kubevirt-absent"
    VM_EXISTS = "vm-exists"
    VMI_STANDALONE = "vmi-standalone"
    VM_UNKNOWN = "vm-unknown"
    # invalid
    POD_MISSING = "pod-missing"
    POD_ON_OTHER_NODE = "pod-on-other-node"
    POD_IP_MISMATCH = "pod-ip-mismatch"
    POD_TERMINATED = "pod-terminated"
    POD_EVICTED = "pod-evicted"
    VM_MISSING = "vm-missing"
    NODE_MISSING = "node-missing"
    NODE_IN_USE = "node-in-use"
    # empty blocks
    EMPTY_BLOCK = "empty-block"
    LAST_BLOCK = "last-block"
    NODE_MIGRATING = "node-migrating"
    BLOCK_GC_DISABLED = "block-gc-disabled"
    UNAFFINE_BLOCK = "unaffine-block"


class Lookup(Enum):
    """Outcome of looking an owner up, when it is not the object itself."""

    MISSING = "missing"  # authoritatively not found (NotFound from a synced cache or the API)
    UNKNOWN = "unknown"  # lookup failed or the object was unparsable: assume it exists


PodView = Pod | Lookup


@dataclass(frozen=True, slots=True)
class KubeVirtView:
    """What the VM rule needs.  Pass `None` instead when KubeVirt is not installed."""

    vms: frozenset[tuple[str, str]]
    # VMI (namespace, name) → whether an ownerReference of kind VirtualMachine points at it.
    vmis_owned_by_vm: Mapping[tuple[str, str], bool]
    # VMs whose mirrored record could not be read: a lookup error, which Calico counts valid.
    unknown: frozenset[tuple[str, str]] = frozenset()


@dataclass(frozen=True, slots=True)
class Validity:
    valid: bool
    reason: Reason


@dataclass(frozen=True, slots=True)
class Verdict:
    """The decision for one allocation at `now`."""

    allocation: Allocation
    type: AllocationType
    valid: bool
    reason: Reason
    state: LeakState
    first_seen: float | None  # when it was first seen invalid (candidate timer), None when valid


def classify(a: Allocation) -> AllocationType:
    """Calico classifies by attributes, never by handle prefix (except the Windows handle)."""
    if a.handle == WINDOWS_RESERVED_HANDLE:
        return AllocationType.RESERVED
    if a.attrs.get(ATTR_TYPE, "") in TUNNEL_TYPES:
        return AllocationType.TUNNEL
    if a.attrs.get(ATTR_NAMESPACE, "") and a.attrs.get(ATTR_POD, ""):
        return AllocationType.VM if ATTR_VMI_NAME in a.attrs else AllocationType.POD
    return AllocationType.UNKNOWN


class _Unparsable(Exception):
    pass


def _split(value: str) -> list[str]:
    return [p for p in (s.strip() for s in value.split(",")) if p]


def pod_is_finished(pod: Pod) -> bool:
    """Calico's `IsFinished`: terminal phase, or (being deleted) the CNI annotation blanked."""
    if pod.deletion_timestamp and (
        pod.annotations.get(ANNOTATION_POD_IP) == "" or pod.annotations.get(ANNOTATION_AWS_POD_IPS) == ""
    ):
        return True
    return pod.phase in FINISHED_PHASES


def pod_reported_ips(pod: Pod) -> list[IPAddress]:
    """The pod's IPs as Calico's workload-endpoint conversion derives them.

    Raises `_Unparsable` on any unparsable IP (the caller treats that as valid).
    """
    if pod_is_finished(pod):
        return []
    if pod.pod_ips:
        texts = list(pod.pod_ips)
    elif pod.pod_ip:
        texts = [pod.pod_ip]
    elif pod.annotations.get(ANNOTATION_POD_IPS):
        texts = _split(pod.annotations[ANNOTATION_POD_IPS])
    elif pod.annotations.get(ANNOTATION_POD_IP):
        texts = _split(pod.annotations[ANNOTATION_POD_IP])
    elif pod.annotations.get(ANNOTATION_AWS_POD_IPS):
        texts = _split(pod.annotations[ANNOTATION_AWS_POD_IPS])
    else:
        texts = []
    try:
        return [parse_ip(t) for t in texts]
    except AddressError as exc:
        raise _Unparsable(str(exc)) from exc


def _vm_validity(a: Allocation, kubevirt: KubeVirtView | Lookup | None) -> Validity:
    ns = a.attrs.get(ATTR_NAMESPACE, "")
    vmi = a.attrs.get(ATTR_VMI_NAME, "")
    if not ns or not vmi:
        return Validity(True, Reason.NO_OWNER_ATTRIBUTES)
    if kubevirt is None:
        return Validity(True, Reason.KUBEVIRT_ABSENT)
    if isinstance(kubevirt, Lookup):
        return Validity(True, Reason.VM_UNKNOWN)
    key = (ns, vmi)
    if key in kubevirt.unknown:
        return Validity(True, Reason.VM_UNKNOWN)
    if key in kubevirt.vms:
        return Validity(True, Reason.VM_EXISTS)
    owned = kubevirt.vmis_owned_by_vm.get(key)
    if owned is False:
        return Validity(True, Reason.VMI_STANDALONE)
    return Validity(False, Reason.VM_MISSING)


def allocation_validity(
    a: Allocation,
    knode: str,
    pod: PodView,
    kubevirt: KubeVirtView | Lookup | None = None,
) -> Validity:
    """Calico's `allocationIsValid`, in its evaluation order (spec §3.7).

    `knode` is the Kubernetes node name of the allocation's Calico node, "" when that node is gone.
    `pod` is the result of looking up `attrs.namespace/attrs.pod` (ignored for tunnel and VM IPs).
    """
    kind = classify(a)
    if kind is AllocationType.TUNNEL:
        return Validity(True, Reason.TUNNEL_NODE_EXISTS) if knode else Validity(False, Reason.NODE_MISSING)
    if kind is AllocationType.VM:
        return _vm_validity(a, kubevirt)
    if not a.attrs.get(ATTR_NAMESPACE, "") or not a.attrs.get(ATTR_POD, ""):
        return Validity(True, Reason.NO_OWNER_ATTRIBUTES)
    if pod is Lookup.UNKNOWN:
        return Validity(True, Reason.POD_UNKNOWN)
    if pod is Lookup.MISSING:
        return Validity(False, Reason.POD_MISSING)
    assert isinstance(pod, Pod)
    try:
        alloc_ip = parse_ip(a.ip)
    except AddressError:
        return Validity(True, Reason.POD_IP_UNPARSABLE)
    if pod.node_name and knode and pod.node_name != knode:
        # Calico would call this "rescheduled" and release it.  We fix #12257: a stale `node`
        # attribute must not release an IP the pod still reports (unparsable IPs: ambiguous, kept).
        try:
            if alloc_ip in pod_reported_ips(pod):
                return Validity(True, Reason.STALE_NODE_ATTRIBUTE)
        except _Unparsable:
            return Validity(True, Reason.POD_IP_UNPARSABLE)
        return Validity(False, Reason.POD_ON_OTHER_NODE)
    if not pod.pod_ip or not pod.pod_ips:
        return Validity(True, Reason.NO_POD_IP_YET)
    if pod.phase == "Failed" and pod.reason == "Evicted":
        return Validity(False, Reason.POD_EVICTED)
    try:
        ips = pod_reported_ips(pod)
    except _Unparsable:
        return Validity(True, Reason.POD_IP_UNPARSABLE)
    if alloc_ip in ips:
        return Validity(True, Reason.POD_RUNNING)
    if pod_is_finished(pod):
        return Validity(False, Reason.POD_TERMINATED)
    return Validity(False, Reason.POD_IP_MISMATCH)


def leak_grace(grace: float | None, is_vm: bool) -> float | None:
    """The grace period that applies to an invalid allocation on a live node (None: not a candidate)."""
    if is_vm:
        return max(VM_RECREATION_GRACE_SECONDS, grace or 0.0)
    return grace


def mark_leak(first_seen: float | None, grace: float, now: float) -> tuple[LeakState, float]:
    """Calico's `markLeak`: start the timer, confirm strictly after `grace`; grace 0 never confirms."""
    start = now if first_seen is None else first_seen
    if grace != 0 and now - start > grace:
        return LeakState.CONFIRMED, start
    return LeakState.CANDIDATE, start


def judge(
    a: Allocation,
    kind: AllocationType,
    validity: Validity,
    node_exists: bool,
    grace: float | None,
    first_seen: float | None,
    now: float,
) -> Verdict:
    """Turn a validity into a leak state (spec §3.6 step 3.4–3.9) for a pod or VM allocation."""
    if validity.valid:
        return Verdict(a, kind, True, validity.reason, LeakState.VALID, None)
    if not node_exists:
        start = now if first_seen is None else first_seen
        return Verdict(a, kind, False, validity.reason, LeakState.CONFIRMED, start)
    g = leak_grace(grace, kind is AllocationType.VM)
    if g is None:
        return Verdict(a, kind, False, validity.reason, LeakState.IGNORED, first_seen)
    state, start = mark_leak(first_seen, g, now)
    return Verdict(a, kind, False, validity.reason, state, start)


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
