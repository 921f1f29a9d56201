"""Watch events and list items decoded from bytes straight into what the watcher keeps (msgspec).

Why: a block event went bytes → orjson dicts → `IPAMBlock` (a dataclass per attribute) → `BlockRecord`,
~190 µs for a /26 block, most of the watcher's cost per pod event; a pod event built every field of a pod
(managedFields, container statuses: ~6 KB in a real cluster) only to keep ten.  Here msgspec decodes the
bytes into structs that name only the fields the rules read (unknown fields are skipped without being
built) and checks their types as it goes; the checks `shared.parse` makes beyond types are repeated on
the typed values.  Anything this fast path does not accept exactly as `shared.parse` would — a type
msgspec refuses, a value a check refuses — returns None, and the caller takes the generic path
(orjson + `shared.parse`), which names the problem and keeps the IPs as before.  So the fast path can only
be faster, never different: tests hold it equal to the generic path on valid and malformed objects.
"""

from __future__ import annotations

import functools
from array import array
from typing import Any

import msgspec

from shared.blockops import released_at_seconds
from shared.blockrecords import (
    GC_ATTRS,
    BlockRecord,
    LeanBlock,
    MirroredBlock,
    Slot,
    attr_print,
    cooling_since,
    dense_seqs,
)
from shared.model import (
    AffinityKind,
    IPAMBlock,
)
from shared.netaddr import AddressError, block_size, parse_network

_GC_KEYS = frozenset(GC_ATTRS)
_AFFINITY_PREFIXES = (AffinityKind.HOST.value, AffinityKind.VIRTUAL.value)


class Meta(msgspec.Struct):
    """The metadata fields the fast paths read (`producer/slimpods.py` too)."""

    name: Any = None
    namespace: Any = None
    uid: Any = None
    resourceVersion: Any = None
    deletionTimestamp: Any = None


class _Attr(msgspec.Struct):
    handle_id: str | None = None
    secondary: dict[str, str] | None = None
    alternateOwnerAttrs: dict[str, str] | None = None
    releasedAt: str | None = None  # IP cooldown (Calico 3.33): a parked, handle-less ordinal


class _BlockSpec(msgspec.Struct):
    cidr: str
    allocations: list[int | None]
    affinity: str | None = None
    attributes: list[msgspec.Raw] | None = None  # decoded per ordinal, when it changed
    unallocated: list[int] | None = None
    sequenceNumber: int | None = None
    sequenceNumberForAllocation: dict[int, int] | None = None
    deleted: bool | None = None


class _Block(msgspec.Struct):
    metadata: Meta
    spec: _BlockSpec


class _Envelope(msgspec.Struct):
    type: str
    object: msgspec.Raw


# A watch event's envelope and its object in one decode (one scan of the line instead of two): what
# `envelope` then `block` / `pod` give, or a DecodeError (a BOOKMARK, an ERROR, anything unexpected),
# and the caller takes `envelope`.
class _BlockEvent(msgspec.Struct):
    type: str
    object: _Block


class ListMeta(msgspec.Struct):
    resourceVersion: Any = None
    # `continue` is a Python keyword: renamed.
    continue_: Any = msgspec.field(default=None, name="continue")


class _List(msgspec.Struct):
    items: list[msgspec.Raw] | None = None
    metadata: ListMeta | None = None


_block_decoder = msgspec.json.Decoder(_Block)
_attr_decoder = msgspec.json.Decoder(_Attr)
_envelope_decoder = msgspec.json.Decoder(_Envelope)
_block_event_decoder = msgspec.json.Decoder(_BlockEvent)
_list_decoder = msgspec.json.Decoder(_List)


def envelope(line: bytes) -> tuple[str, msgspec.Raw] | None:
    """A watch event's type and its object's bytes; None if the line is not such an event."""
    try:
        env = _envelope_decoder.decode(line)
    except msgspec.DecodeError:
        return None
    return env.type, env.object


def list_page(body: bytes | bytearray) -> tuple[list[msgspec.Raw], str, str | None] | None:
    """A list page's items (as bytes), resourceVersion and continue token; None if not a list."""
    try:
        page = _list_decoder.decode(body)
    except msgspec.DecodeError:
        return None
    meta = page.metadata or ListMeta()
    rv = meta.resourceVersion if isinstance(meta.resourceVersion, str) else ""
    token = meta.continue_ if isinstance(meta.continue_, str) and meta.continue_ else None
    return page.items or [], rv, token


def text(value: object) -> str:
    return value if isinstance(value, str) else ""


def block(raw: bytes | msgspec.Raw) -> tuple[MirroredBlock, str] | None:
    """(block, resourceVersion), or None: take the generic path (see the module docstring)."""
    try:
        b = _block_decoder.decode(raw)
    except msgspec.DecodeError:
        return None
    return _lean_block(b, _RELEASED_AT in (raw if isinstance(raw, bytes) else bytes(raw)))


def block_event(line: bytes) -> tuple[str, tuple[MirroredBlock, str] | None] | None:
    """A watch event of a block in one decode: (type, what `block` gives of its object); None when the
    line does not decode so (take `envelope`)."""
    try:
        event = _block_event_decoder.decode(line)
    except msgspec.DecodeError:
        return None
    return event.type, _lean_block(event.object, _RELEASED_AT in line)


@functools.lru_cache(maxsize=65536)
def _block_shape(cidr: str) -> tuple[int, str] | None:
    """A block CIDR's size and canonical text, None if it is not a strict CIDR.  Cached: the same few
    thousand CIDRs come back in every event, and `ipaddress` computes a network's size and text anew
    each time it is asked (two of each per event were about a tenth of the decode under cProfile)."""
    try:
        net = parse_network(cidr, strict=True)
    except AddressError:
        return None
    return block_size(net), str(net)


def _lean_block(b: _Block, may_cool: bool) -> tuple[MirroredBlock, str] | None:
    """`may_cool`: the bytes it was decoded from name `releasedAt` somewhere (one search of the whole
    object instead of one per attribute; most blocks have no cooling ordinal)."""
    name, spec = b.metadata.name, b.spec
    if not isinstance(name, str) or not name:
        return None
    shape = _block_shape(spec.cidr)
    if shape is None:
        return None
    size, cidr = shape
    affinity = spec.affinity
    if affinity is not None:
        prefix, sep, target = affinity.partition(":")
        if not sep or prefix not in _AFFINITY_PREFIXES or not target:
            return None
    attrs = spec.attributes or []
    allocations = spec.allocations
    if len(allocations) != size:
        return None
    n_attrs = len(attrs)
    # The checks `shared.parse` makes, with the loops in C where a builtin can take them.
    used = [i for i in allocations if i is not None]
    in_use = len(used)
    if used and (min(used) < 0 or max(used) >= n_attrs):
        return None
    free = spec.unallocated
    if free:
        if min(free) < 0 or max(free) >= size or len(set(free)) != len(free):
            return None
        if any(allocations[o] is not None for o in free):
            return None
    seqs = spec.sequenceNumberForAllocation or {}
    if seqs and (min(seqs) < 0 or max(seqs) >= size or min(seqs.values()) < 0):
        return None
    if spec.sequenceNumber is not None and spec.sequenceNumber < 0:
        return None
    referenced = set(used)
    if len(referenced) < n_attrs:
        for i, attr in enumerate(attrs):
            # An attribute no ordinal names is never diffed: check it here, as `shared.parse` checks them all.
            if i not in referenced and not _valid_attr(attr):
                return None
    # Per ordinal, its attribute's bytes: msgspec's views of the event (compared by content; no copy per
    # attribute), looked up in C through a dict that maps an unallocated ordinal's None to None.
    by_index: dict[int | None, msgspec.Raw | None] = dict(enumerate(attrs))
    by_index[None] = None
    per_ordinal = list(map(by_index.__getitem__, allocations))
    # Their prints likewise (`shared.blockrecords.attr_print`, in C loops): what the watcher keeps of them.
    print_of: dict[int | None, int] = dict(enumerate(map(attr_print, attrs)))
    print_of[None] = 0
    prints = array("Q", map(print_of.__getitem__, allocations))
    host = affinity[len("host:") :] if affinity is not None and affinity.startswith("host:") else None
    rv = text(b.metadata.resourceVersion)
    # Cooling ordinals (IP cooldown): only attributes that name `releasedAt` are decoded for it.
    cooling = None
    if may_cool:
        blobs = [bytes(attrs[i]) for i in used]
        cooling = _cooling_since([blob for blob in blobs if _RELEASED_AT in blob])
    record = LeanBlock(
        rv, text(b.metadata.uid), host, in_use, per_ordinal, dense_seqs(seqs, size), cooling, prints
    )
    return MirroredBlock(cidr, bool(spec.deleted), record), rv


class BadAttribute(ValueError):
    """An allocation attribute `shared.parse` would refuse (the whole block is then malformed)."""


def slot_of_attr(raw: tuple[object, int]) -> Slot | None:
    """An ordinal's (attribute JSON, sequence number) decoded as the mirror keeps it: None when the
    attribute has no handle (not an allocation the collector tracks); `BadAttribute` when malformed."""
    data = raw[0]
    if not isinstance(data, bytes | msgspec.Raw):
        raise BadAttribute(f"attribute is {type(data).__name__}, not JSON")
    try:
        attr = _attr_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise BadAttribute(str(exc)) from None
    if attr.handle_id is None:
        return None
    secondary = attr.secondary
    if secondary:
        # The dict msgspec just built is this slot's own: drop the CNI timestamp from it and keep it
        # when only GC attributes remain (the common case), rather than copy it.
        secondary.pop("timestamp", None)
        if not _GC_KEYS.issuperset(secondary):
            secondary = {k: secondary[k] for k in GC_ATTRS if k in secondary}
    return Slot(attr.handle_id, raw[1], secondary or {})


def _valid_attr(raw: msgspec.Raw) -> bool:
    try:
        _attr_decoder.decode(raw)
    except msgspec.DecodeError:
        return False
    return True


def lean_of(block: IPAMBlock) -> LeanBlock:
    """The lean record of a block the generic path parsed (its attributes re-encoded as JSON)."""
    encoded = [
        msgspec.json.encode({"handle_id": a.handle_id, "secondary": dict(a.secondary)})
        for a in block.attributes
    ]
    per_ordinal = [encoded[i] if i is not None else None for i in block.allocations]
    in_use = sum(1 for a in per_ordinal if a is not None)
    seqs = dense_seqs(block.sequence_number_for_allocation, len(block.allocations))
    cooling = cooling_since(block.attributes, block.allocations)
    return LeanBlock(block.resource_version, block.uid, block.host, in_use, per_ordinal, seqs, cooling)


def materialize(lean: LeanBlock) -> BlockRecord | None:
    """Every slot decoded (None if one is malformed): what `block_record` makes of the same block."""
    slots: dict[int, Slot] = {}
    try:
        for o in lean.allocated():
            raw = lean.raw(o)
            slot = slot_of_attr(raw) if raw is not None else None
            if slot is not None:
                slots[o] = slot
    except BadAttribute:
        return None
    return BlockRecord(lean.resource_version, lean.uid, lean.host, lean.in_use, slots, lean.cooling_since)


_RELEASED_AT = b'"releasedAt"'


def _cooling_since(blobs: list[bytes]) -> float | None:
    """`shared.records.cooling_since` on attribute bytes: the earliest readable `releasedAt` of a
    handle-less attribute."""
    earliest: float | None = None
    for blob in blobs:
        try:
            attr = _attr_decoder.decode(blob)
        except msgspec.DecodeError:
            continue  # refused when its ordinal is decoded
        if attr.handle_id is None and attr.releasedAt is not None:
            when = released_at_seconds(attr.releasedAt)
            if when is not None and (earliest is None or when < earliest):
                earliest = when
    return earliest
