"""Raw Kubernetes JSON → typed models, at the edge, with a named error for every malformed shape.

Nothing downstream of these functions sees raw JSON.  A malformed object raises a `MalformedObject`
subclass carrying its kind and name; callers log it, count it and skip it, and never decide a release from
it (see `shared/snapshot.py` for how a skipped pod or block keeps the IPs that might depend on it).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any, TypeVar

from shared import errors as e
from shared.model import (
    POD_IP_ANNOTATIONS,
    AffinityKind,
    Attribute,
    BlockAffinity,
    IPAMBlock,
    IPAMHandle,
    Node,
    Pod,
)
from shared.netaddr import AddressError, block_size, parse_ip, parse_network

JSON = Mapping[str, Any]
T = TypeVar("T")


def _metadata(kind: str, raw: object, *, namespaced: bool = False) -> tuple[str, str, JSON]:
    if not isinstance(raw, Mapping):
        raise e.WrongFieldType(kind, "", f"object is a {type(raw).__name__}, not a JSON object")
    meta = raw.get("metadata")
    if not isinstance(meta, Mapping):
        raise e.MissingMetadata(kind, "", "no metadata")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise e.MissingMetadata(kind, "", "metadata.name missing or not a string")
    namespace = ""
    if namespaced:
        ns = meta.get("namespace")
        if not isinstance(ns, str) or not ns:
            raise e.MissingMetadata(kind, name, "metadata.namespace missing or not a string")
        namespace = ns
    return name, namespace, meta


def _spec(kind: str, name: str, raw: JSON) -> JSON:
    spec = raw.get("spec")
    if not isinstance(spec, Mapping):
        raise e.MissingSpec(kind, name, "spec missing or not an object")
    return spec


def _opt(kind: str, name: str, obj: JSON, key: str, typ: type[T], default: T) -> T:
    value = obj.get(key)
    if value is None:
        return default
    if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
        raise e.WrongFieldType(kind, name, f"{key} is a {type(value).__name__}, not {typ.__name__}")
    return value


def _str_map(kind: str, name: str, value: object, what: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise e.BadAttributes(kind, name, f"{what} must map strings to strings")
    return dict(value)


def _seq(kind: str, name: str, value: object, what: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise e.BadSequenceNumber(kind, name, f"{what} must be a non-negative integer, got {value!r}")
    return value


def _resource_version(meta: JSON) -> str:
    rv = meta.get("resourceVersion")
    return rv if isinstance(rv, str) else ""


def _uid(meta: JSON) -> str:
    uid = meta.get("uid")
    return uid if isinstance(uid, str) else ""


def parse_block(raw: object) -> IPAMBlock:
    kind = "IPAMBlock"
    name, _, meta = _metadata(kind, raw)
    assert isinstance(raw, Mapping)
    spec = _spec(kind, name, raw)

    cidr_text = spec.get("cidr")
    if not isinstance(cidr_text, str):
        raise e.BadCIDR(kind, name, "spec.cidr missing or not a string")
    try:
        loose = parse_network(cidr_text, strict=False)
    except AddressError as exc:
        raise e.BadCIDR(kind, name, str(exc)) from exc
    try:
        cidr = parse_network(cidr_text, strict=True)
    except AddressError as exc:
        raise e.NonCanonicalCIDR(kind, name, f"{cidr_text} has host bits set (expected {loose})") from exc
    size = block_size(cidr)

    affinity = spec.get("affinity")
    if affinity is not None:
        if not isinstance(affinity, str):
            raise e.BadAffinity(kind, name, "spec.affinity is not a string")
        prefix, sep, target = affinity.partition(":")
        if not sep or prefix not in (AffinityKind.HOST, AffinityKind.VIRTUAL):
            raise e.UnknownAffinityPrefix(kind, name, f"affinity {affinity!r}")
        if not target:
            raise e.BadAffinity(kind, name, f"affinity {affinity!r} names no host")

    raw_attrs = spec.get("attributes")
    if raw_attrs is None:
        raw_attrs = []
    if not isinstance(raw_attrs, list):
        raise e.WrongFieldType(kind, name, "spec.attributes is not a list")
    attributes: list[Attribute] = []
    for i, a in enumerate(raw_attrs):
        if not isinstance(a, Mapping):
            raise e.BadAttributes(kind, name, f"attributes[{i}] is not an object")
        handle = a.get("handle_id")
        if handle is not None and not isinstance(handle, str):
            raise e.NonStringHandle(kind, name, f"attributes[{i}].handle_id is {handle!r}")
        released = a.get("releasedAt")
        attributes.append(
            Attribute(
                handle_id=handle,
                secondary=_str_map(kind, name, a.get("secondary"), f"attributes[{i}].secondary"),
                alternate_owner_attrs=_str_map(
                    kind, name, a.get("alternateOwnerAttrs"), f"attributes[{i}].alternateOwnerAttrs"
                ),
                released_at=released if isinstance(released, str) else None,
            )
        )

    raw_allocs = spec.get("allocations")
    if not isinstance(raw_allocs, list):
        raise e.WrongFieldType(kind, name, "spec.allocations missing or not a list")
    if len(raw_allocs) != size:
        raise e.AllocationsLengthMismatch(
            kind, name, f"{len(raw_allocs)} allocations for a block of {size} addresses"
        )
    allocations: list[int | None] = []
    for i, idx in enumerate(raw_allocs):
        if idx is None:
            allocations.append(None)
            continue
        if isinstance(idx, bool) or not isinstance(idx, int):
            raise e.WrongFieldType(kind, name, f"allocations[{i}] is {idx!r}, not an index")
        if not 0 <= idx < len(attributes):
            raise e.AttributeIndexOutOfRange(
                kind, name, f"allocations[{i}] = {idx} but there are {len(attributes)} attributes"
            )
        allocations.append(idx)

    raw_free = spec.get("unallocated")
    if raw_free is None:
        raw_free = []
    if not isinstance(raw_free, list):
        raise e.WrongFieldType(kind, name, "spec.unallocated is not a list")
    seen: set[int] = set()
    for o in raw_free:
        if isinstance(o, bool) or not isinstance(o, int):
            raise e.WrongFieldType(kind, name, f"unallocated holds {o!r}, not an ordinal")
        if not 0 <= o < size:
            raise e.OrdinalOutOfRange(kind, name, f"unallocated ordinal {o} outside 0..{size - 1}")
        if o in seen:
            raise e.DuplicateFreeOrdinal(kind, name, f"ordinal {o} twice in unallocated")
        if allocations[o] is not None:
            raise e.OrdinalAllocatedAndFree(kind, name, f"ordinal {o} is allocated and unallocated")
        seen.add(o)

    raw_seqs = spec.get("sequenceNumberForAllocation")
    if raw_seqs is None:
        raw_seqs = {}
    if not isinstance(raw_seqs, Mapping):
        raise e.BadSequenceNumber(kind, name, "sequenceNumberForAllocation is not an object")
    seqs: dict[int, int] = {}
    for key, value in raw_seqs.items():
        # isascii: str.isdigit() also accepts "²" and other scripts' digits, which int() refuses.
        if not isinstance(key, str) or not (key.isascii() and key.isdigit()) or not 0 <= int(key) < size:
            raise e.BadSequenceNumber(kind, name, f"sequenceNumberForAllocation key {key!r}")
        seqs[int(key)] = _seq(kind, name, value, f"sequenceNumberForAllocation[{key}]")

    deleted = spec.get("deleted")
    if deleted is not None and not isinstance(deleted, bool):
        raise e.WrongFieldType(kind, name, "spec.deleted is not a boolean")
    claim = spec.get("affinityClaimTime")
    return IPAMBlock(
        name=name,
        cidr=cidr,
        affinity=affinity,
        allocations=tuple(allocations),
        unallocated=tuple(raw_free),
        attributes=tuple(attributes),
        sequence_number=_seq(kind, name, spec.get("sequenceNumber"), "sequenceNumber"),
        sequence_number_for_allocation=seqs,
        deleted=bool(deleted),
        affinity_claim_time=claim if isinstance(claim, str) else None,
        resource_version=_resource_version(meta),
        uid=_uid(meta),
    )


def parse_handle(raw: object) -> IPAMHandle:
    kind = "IPAMHandle"
    name, _, meta = _metadata(kind, raw)
    assert isinstance(raw, Mapping)
    spec = _spec(kind, name, raw)
    handle_id = spec.get("handleID")
    if not isinstance(handle_id, str) or not handle_id:
        raise e.NonStringHandle(kind, name, f"spec.handleID is {handle_id!r}")
    blocks = spec.get("block")
    if blocks is None:
        blocks = {}
    if not isinstance(blocks, Mapping):
        raise e.WrongFieldType(kind, name, "spec.block is not an object")
    counts: dict[str, int] = {}
    for cidr, count in blocks.items():
        try:
            net = parse_network(str(cidr))
        except AddressError as exc:
            raise e.BadCIDR(kind, name, f"spec.block key: {exc}") from exc
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise e.WrongFieldType(kind, name, f"spec.block[{cidr}] = {count!r}")
        counts[sys.intern(str(net))] = count  # one string per block CIDR, however many handles name it
    deleted = spec.get("deleted")
    if deleted is not None and not isinstance(deleted, bool):
        raise e.WrongFieldType(kind, name, "spec.deleted is not a boolean")
    return IPAMHandle(
        name=name,
        handle_id=name if handle_id == name else handle_id,  # the usual case: one string, not two
        block=counts,
        deleted=bool(deleted),
        resource_version=_resource_version(meta),
    )


def parse_affinity(raw: object) -> BlockAffinity:
    kind = "BlockAffinity"
    name, _, meta = _metadata(kind, raw)
    assert isinstance(raw, Mapping)
    spec = _spec(kind, name, raw)
    node = spec.get("node")
    if not isinstance(node, str) or not node:
        raise e.BadAffinity(kind, name, "spec.node missing or not a string")
    state = _opt(kind, name, spec, "state", str, "")
    typ = _opt(kind, name, spec, "type", str, "") or AffinityKind.HOST
    if typ not in (AffinityKind.HOST, AffinityKind.VIRTUAL):
        raise e.UnknownAffinityPrefix(kind, name, f"type {typ!r}")
    cidr_text = spec.get("cidr")
    if not isinstance(cidr_text, str):
        raise e.BadCIDR(kind, name, "spec.cidr missing or not a string")
    try:
        cidr = parse_network(cidr_text)
    except AddressError as exc:
        raise e.BadCIDR(kind, name, str(exc)) from exc
    deleted_raw = spec.get("deleted")
    if isinstance(deleted_raw, bool):
        deleted = deleted_raw
    elif deleted_raw in (None, "", "false"):
        deleted = False
    elif deleted_raw == "true":
        deleted = True
    else:
        raise e.WrongFieldType(kind, name, f"spec.deleted is {deleted_raw!r}")
    labels = meta.get("labels")
    return BlockAffinity(
        name=name,
        state=state,
        node=node,
        type=AffinityKind(typ),
        cidr=cidr,
        deleted=deleted,
        labels=_str_map(kind, name, labels, "metadata.labels"),
        resource_version=_resource_version(meta),
    )


def parse_pod(raw: object) -> Pod:
    """Slim a pod to what the rules read.  Raises BadPodIP for an unparsable reported IP, carrying the
    slim pod with its IPs unparsed (the rules judge it: valid unless evicted, finished or terminating)."""
    kind = "Pod"
    name, namespace, meta = _metadata(kind, raw, namespaced=True)
    assert isinstance(raw, Mapping)
    ident = f"{namespace}/{name}"
    spec = raw.get("spec") or {}
    status = raw.get("status") or {}
    if not isinstance(spec, Mapping) or not isinstance(status, Mapping):
        raise e.WrongFieldType(kind, ident, "spec or status is not an object")
    pod_ip = _opt(kind, ident, status, "podIP", str, "")
    raw_ips = status.get("podIPs") or []
    if not isinstance(raw_ips, list):
        raise e.WrongFieldType(kind, ident, "status.podIPs is not a list")
    pod_ips: list[str] = []
    for item in raw_ips:
        ip = item.get("ip") if isinstance(item, Mapping) else None
        if not isinstance(ip, str):
            raise e.BadPodIP(kind, ident, f"status.podIPs entry {item!r}")
        pod_ips.append(ip)
    annotations = meta.get("annotations")
    if annotations is not None and not isinstance(annotations, Mapping):
        raise e.WrongFieldType(kind, ident, "metadata.annotations is not an object")
    kept = {k: v for k, v in (annotations or {}).items() if k in POD_IP_ANNOTATIONS and isinstance(v, str)}
    pod = Pod(
        namespace=namespace,
        name=name,
        uid=_uid(meta),
        node_name=_opt(kind, ident, spec, "nodeName", str, ""),
        host_network=_opt(kind, ident, spec, "hostNetwork", bool, False),
        phase=_opt(kind, ident, status, "phase", str, ""),
        reason=_opt(kind, ident, status, "reason", str, ""),
        pod_ip=pod_ip,
        pod_ips=tuple(pod_ips),
        annotations=kept,
        deletion_timestamp=meta.get("deletionTimestamp") is not None,
        resource_version=_resource_version(meta),
    )
    for ip in [pod_ip, *pod_ips] if pod_ip else pod_ips:
        try:
            parse_ip(ip)
        except AddressError as exc:
            raise e.BadPodIP(kind, ident, str(exc), pod=pod) from exc
    return pod


def parse_node(raw: object) -> Node:
    kind = "Node"
    name, _, meta = _metadata(kind, raw)
    return Node(
        name=name,
        labels=_str_map(kind, name, meta.get("labels"), "metadata.labels"),
        uid=_uid(meta),
        resource_version=_resource_version(meta),
    )
