"""Pods decoded from bytes straight into what the watcher keeps (msgspec): one pod, a pod's watch event,
a list page of pods.  The fast path of `producer/slim.py` (its module docstring says why and how it is
held equal to the generic path), for pods.
"""

from __future__ import annotations

from typing import Any

import msgspec

from producer.slim import ListMeta, Meta, text
from shared.model import ANNOTATION_AWS_POD_IPS, ANNOTATION_POD_IP, ANNOTATION_POD_IPS, Pod
from shared.netaddr import is_ip


class _Annotations(msgspec.Struct):
    pod_ips: Any = msgspec.field(default=None, name=ANNOTATION_POD_IPS)
    pod_ip: Any = msgspec.field(default=None, name=ANNOTATION_POD_IP)
    aws_pod_ips: Any = msgspec.field(default=None, name=ANNOTATION_AWS_POD_IPS)


class _PodMeta(Meta):
    annotations: _Annotations | None = None


class _PodSpec(msgspec.Struct):
    nodeName: str | None = None
    hostNetwork: bool | None = None


class _PodIP(msgspec.Struct):
    ip: str


class _PodStatus(msgspec.Struct):
    phase: str | None = None
    reason: str | None = None
    podIP: str | None = None
    podIPs: list[_PodIP] | None = None


class _Pod(msgspec.Struct):
    metadata: _PodMeta
    spec: _PodSpec | None = None
    status: _PodStatus | None = None


class _PodEvent(msgspec.Struct):
    type: str
    object: _Pod


class _PodList(msgspec.Struct):
    """A page of pods typed in the same scan that frames it (`pod_list_page`)."""

    items: list[_Pod] | None = None
    metadata: ListMeta | None = None


_pod_decoder = msgspec.json.Decoder(_Pod)
_pod_event_decoder = msgspec.json.Decoder(_PodEvent)
_pod_list_decoder = msgspec.json.Decoder(_PodList)


def pod(raw: bytes | msgspec.Raw) -> tuple[Pod, str] | None:
    """(slim pod, resourceVersion), or None: take the generic path (see the module docstring)."""
    try:
        p = _pod_decoder.decode(raw)
    except msgspec.DecodeError:
        return None
    return _slim_pod(p)


def pod_event(line: bytes) -> tuple[str, tuple[Pod, str] | None] | None:
    """A watch event of a pod in one decode (see `block_event`)."""
    try:
        event = _pod_event_decoder.decode(line)
    except msgspec.DecodeError:
        return None
    return event.type, _slim_pod(event.object)


def _slim_pod(p: _Pod) -> tuple[Pod, str] | None:
    meta = p.metadata
    name, namespace = meta.name, meta.namespace
    if not isinstance(name, str) or not name or not isinstance(namespace, str) or not namespace:
        return None
    spec = p.spec or _PodSpec()
    status = p.status or _PodStatus()
    pod_ip = status.podIP or ""
    pod_ips = tuple(item.ip for item in status.podIPs or ())
    if not all(map(is_ip, (pod_ip, *pod_ips) if pod_ip else pod_ips)):
        return None
    kept: dict[str, str] = {}
    ann = meta.annotations
    if ann is not None:
        for key, value in (
            (ANNOTATION_POD_IPS, ann.pod_ips),
            (ANNOTATION_POD_IP, ann.pod_ip),
            (ANNOTATION_AWS_POD_IPS, ann.aws_pod_ips),
        ):
            if isinstance(value, str):
                kept[key] = value
    rv = text(meta.resourceVersion)
    slim = Pod(
        namespace=namespace,
        name=name,
        uid=text(meta.uid),
        node_name=spec.nodeName or "",
        host_network=bool(spec.hostNetwork),
        phase=status.phase or "",
        reason=status.reason or "",
        pod_ip=pod_ip,
        pod_ips=pod_ips,
        annotations=kept,
        deletion_timestamp=meta.deletionTimestamp is not None,
        resource_version=rv,
    )
    return slim, rv


def pod_list_page(body: bytes | bytearray) -> tuple[list[Pod], str, str | None] | None:
    """A page of pods typed in one scan of its body: (slim pods, resourceVersion, continue token), exactly
    what `list_page` then `pod` on each item give; None when any item would not take the fast path (a
    type msgspec refuses, a value `_slim_pod` refuses): the caller then reads the page item by item, each
    such item through the generic path.  Why: `list_page` scans a page once to frame its items and `pod`
    each item again; at 10,000 real-size pods (130 MB of JSON) the framing scan alone cost ~0.09 s of a
    cold start's CPU (docs/benchmarks.md, "The real server's cold start, taken apart")."""
    try:
        page = _pod_list_decoder.decode(body)
    except msgspec.DecodeError:
        return None
    pods: list[Pod] = []
    for p in page.items or ():
        slim_pod = _slim_pod(p)
        if slim_pod is None:
            return None
        pods.append(slim_pod[0])
    meta = page.metadata or ListMeta()
    rv = meta.resourceVersion if isinstance(meta.resourceVersion, str) else ""
    token = meta.continue_ if isinstance(meta.continue_, str) and meta.continue_ else None
    return pods, rv, token
