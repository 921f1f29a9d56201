"""One allocation's verdict as Calico's IPAM GC reaches it: its type, whether it is valid, its leak state.

Why a module of its own: this is the per-allocation decision (spec §3.7 `allocationIsValid`, §3.8 the VM
rule, §3.6 steps 3.4–3.9 the leak timer), the part of the rules that decides a single IP and carries our
one deliberate difference from Calico (bug #12257, PR #13538: when a pod's reported IPs contain the
allocation IP, it is valid whatever its `node` attribute says).  `shared.rules` applies it node by node
and re-exports its names.  Everything ambiguous resolves to *valid*.  Pure: callers pass `now`.
"""

from __future__ import annotations

from shared.model import (
    ATTR_NAMESPACE,
    ATTR_POD,
    ATTR_TYPE,
    ATTR_VMI_NAME,
    TUNNEL_TYPES,
    WINDOWS_RESERVED_HANDLE,
    Allocation,
    Pod,
)
from shared.netaddr import AddressError, parse_ip
from shared.podips import UnparsablePodIP, pod_is_finished, pod_reported_ips
from shared.verdicts import (
    AllocationType,
    KubeVirtView,
    LeakState,
    Lookup,
    PodView,
    Reason,
    Validity,
    Verdict,
)

# Calico's `defaultVMRecreationGracePeriod`: VM allocations on live nodes wait at least this long.
VM_RECREATION_GRACE_SECONDS = 300.0


def classify(a: Allocation) -> AllocationType:
    """Calico classifies by attributes, never by handle prefix (except the Windows handle)."""
    if a.handle == WINDOWS_RESERVED_HANDLE:
        return AllocationType.RESERVED
    if a.attrs.get(ATTR_TYPE, "") in TUNNEL_TYPES:
        return AllocationType.TUNNEL
    if a.attrs.get(ATTR_NAMESPACE, "") and a.attrs.get(ATTR_POD, ""):
        return AllocationType.VM if ATTR_VMI_NAME in a.attrs else AllocationType.POD
    return AllocationType.UNKNOWN


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
    *,
    live: bool = False,
) -> Validity:
    """Calico's `allocationIsValid`, in its evaluation order (spec §3.7).

    `knode` is the Kubernetes node name of the allocation's Calico node, "" when that node is gone.
    `pod` is the result of looking up `attrs.namespace/attrs.pod` (ignored for tunnel and VM IPs).
    `live`: the pod was read from the API, not from the mirror.  Calico judges from its informer cache,
    whose slim pods carry neither `status.reason` nor `metadata.deletionTimestamp` (`PodTransformer`),
    and reads a pod live only in the final re-check of a leak on a node that exists: so the eviction test
    before the IPs are parsed, and a terminating pod whose CNI annotation was blanked counting as
    finished, are live-only (`shared.podips`).  In the mirror's view a failed pod is invalid only once its
    IPs parse, as every finished pod (its reason still names the eviction).
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
            if alloc_ip in pod_reported_ips(pod, live=live):
                return Validity(True, Reason.STALE_NODE_ATTRIBUTE)
        except UnparsablePodIP:
            return Validity(True, Reason.POD_IP_UNPARSABLE)
        return Validity(False, Reason.POD_ON_OTHER_NODE)
    if not pod.pod_ip or not pod.pod_ips:
        return Validity(True, Reason.NO_POD_IP_YET)
    evicted = pod.phase == "Failed" and pod.reason == "Evicted"
    if live and evicted:
        return Validity(False, Reason.POD_EVICTED)
    try:
        ips = pod_reported_ips(pod, live=live)
    except UnparsablePodIP:
        return Validity(True, Reason.POD_IP_UNPARSABLE)
    if alloc_ip in ips:
        return Validity(True, Reason.POD_RUNNING)
    if pod_is_finished(pod, live=live):
        return Validity(False, Reason.POD_EVICTED if evicted else Reason.POD_TERMINATED)
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
