"""A pod's IPs as Calico's workload-endpoint conversion derives them: the evidence the pod rule weighs.

Why a module of its own: which IPs a pod reports (its status, else the CNI annotations, none once it is
finished) is Calico's conversion logic, not a verdict; `shared.allocrules` asks it whether an allocation's
IP is still the pod's (and, for our fix of Calico bug #12257, whether a stale `node` attribute may be
ignored).  Pure: no I/O, no clock.

Two views of one pod, as Calico has them (`live`): its informer cache, whose pods its `PodTransformer`
slims to name, node, phase, status IPs and the three IP annotations — no `deletionTimestamp`, no
`status.reason` — and a live GET (the final re-check of a leak on a node that exists).  Only the live
view can see a pod being deleted, so only it finishes a pod whose CNI annotation was blanked.
"""

from __future__ import annotations

from shared.model import (
    ANNOTATION_AWS_POD_IPS,
    ANNOTATION_POD_IP,
    ANNOTATION_POD_IPS,
    FINISHED_PHASES,
    Pod,
)
from shared.netaddr import AddressError, IPAddress, parse_ip


class UnparsablePodIP(Exception):
    """A pod reports an IP that does not parse (the rules treat that as valid: ambiguous)."""


def _split(value: str) -> list[str]:
    return [p for p in (s.strip() for s in value.split(",")) if p]


def pod_is_finished(pod: Pod, *, live: bool = False) -> bool:
    """Calico's `IsFinished`: terminal phase, or (being deleted, seen `live`) the CNI annotation blanked.

    Not `live` (Calico's cache, and so the workers' and `check`'s view): the deletion timestamp is not
    there to see, and a terminating pod whose annotation was blanked is not finished."""
    if (
        live
        and pod.deletion_timestamp
        and (
            pod.annotations.get(ANNOTATION_POD_IP) == "" or pod.annotations.get(ANNOTATION_AWS_POD_IPS) == ""
        )
    ):
        return True
    return pod.phase in FINISHED_PHASES


def reported_ip_texts(pod: Pod) -> list[str]:
    """The texts of the IPs a pod reports, unparsed, from the first source that has any (`getPodIPs`):
    its status, else the CNI annotations."""
    if pod.pod_ips:
        return list(pod.pod_ips)
    if pod.pod_ip:
        return [pod.pod_ip]
    for name in (ANNOTATION_POD_IPS, ANNOTATION_POD_IP, ANNOTATION_AWS_POD_IPS):
        if pod.annotations.get(name):
            return _split(pod.annotations[name])
    return []


def pod_reported_ips(pod: Pod, *, live: bool = False) -> list[IPAddress]:
    """The pod's IPs as Calico's workload-endpoint conversion derives them: parsed first (`getPodIPs`),
    then none if the pod is finished (`IsFinished`), in that order, so a finished pod whose IPs do not
    parse is ambiguous too.

    Raises `UnparsablePodIP` on any unparsable IP (the caller treats that as valid).
    """
    texts = reported_ip_texts(pod)
    try:
        ips = [parse_ip(t) for t in texts]
    except AddressError as exc:
        raise UnparsablePodIP(str(exc)) from exc
    return [] if pod_is_finished(pod, live=live) else ips
