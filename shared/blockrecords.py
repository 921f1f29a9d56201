"""Block records: how the watcher mirrors an IPAM block into Redis, and the lean form it diffs events in.

Why a module of its own: blocks are the watcher's hot path.  Every block event is diffed ordinal by
ordinal, and only what changed is re-packed, so a block's record is packed slot by slot (`encode_slot`)
and versioned on its own (`BLOCK_VERSION`, read back to version 1); the watcher's in-memory form of a
block (`LeanBlock`, `MirroredBlock`) and the attribute fingerprints it compares belong with it.  The other
record layouts, which change and are read one object at a time, are in `shared.records` (which re-exports
these names: the watcher and the workers import them from there) and `shared.gcrecords`.

A slot keeps an ordinal's GC attributes (`gc_attrs`), as an allocation record does.  Decoding bad bytes
raises a `shared.codec` `RecordError`.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, NamedTuple, TypeAlias

import msgspec
import xxhash

from shared.blockops import released_at_seconds
from shared.codec import (
    NotMsgpack,
    TruncatedRecord,
    WrongRecordShape,
    as_float,
    as_int,
    as_opt_str,
    as_str,
    as_str_map,
    pack,
    record_fields,
    unpack,
)
from shared.model import (
    ATTR_NAMESPACE,
    ATTR_NODE,
    ATTR_POD,
    ATTR_TYPE,
    ATTR_VMI_NAME,
    Attribute,
    IPAMBlock,
)

# The allocation attributes the rules read (classification, owner lookup, shard).  Others are dropped.
GC_ATTRS = (ATTR_NODE, ATTR_NAMESPACE, ATTR_POD, ATTR_TYPE, ATTR_VMI_NAME)


def gc_attrs(attrs: Mapping[str, str]) -> dict[str, str]:
    return {k: attrs[k] for k in GC_ATTRS if k in attrs}


# -- block: [2, resourceVersion, uid, host | nil, in use, {ordinal: bin(slot)}(, cooling since)] ----------
# A slot is packed on its own (`encode_slot`: [handle, seq, gc attrs]) so that the watcher re-packs only the
# ordinals an event changed and writes the rest as the bytes it already holds.  Only blocks with IPs in
# cooldown carry the seventh field.  Version 1 held the slots as nested arrays; it is still read (a Redis
# written by an older watcher).

BLOCK_VERSION = 2
# Block records asked for per HSCAN of `P:blocks`.  A /26 block's record is ~8 KB with real pods' GC
# attributes, so a count of 1,000 made every reply ~8 MB, built whole in Redis's output buffer and in the
# client: at 150,000 pods the leader's backstop scan, right after a cold start, took Redis's RSS from 156
# to 184 MiB for ~5 s (its peak 188.7; 161.3 with this count; docs/benchmarks.md, "Memory at 150,000
# pods, taken apart").  64: ~0.5 MB a reply.
BLOCK_SCAN_COUNT = 64


class Slot(NamedTuple):
    """One tracked ordinal of a block, as the mirror last saw it.  A named tuple, not a frozen dataclass:
    the watcher builds one per allocated ordinal of every block event, and a frozen dataclass's
    `__init__` cost three times as much."""

    handle: str
    sequence_number: int
    attrs: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class BlockRecord:
    resource_version: str
    uid: str
    host: str | None  # `host:` affinity only
    in_use: int  # non-null ordinals, handle or not (GC emptiness)
    slots: Mapping[int, Slot] = field(default_factory=dict)
    # The earliest `releasedAt` (epoch s) of the block's cooling ordinals (IP cooldown, Calico 3.33:
    # handle-less ordinals parked by a release); None when none cools.  Calico's `coldBlocks` entry.
    cooling_since: float | None = None


def cooling_since(attributes: Sequence[Attribute], allocations: Sequence[int | None]) -> float | None:
    """The earliest readable `releasedAt` among handle-less ordinals (an unreadable one never ends its
    cooldown, so it is not tracked: the cold-IP backstop has nothing to return)."""
    earliest: float | None = None
    for index in allocations:
        if index is None:
            continue
        attr = attributes[index]
        if attr.handle_id is None and attr.released_at is not None:
            when = released_at_seconds(attr.released_at)
            if when is not None and (earliest is None or when < earliest):
                earliest = when
    return earliest


def block_record(block: IPAMBlock) -> BlockRecord:
    # The ordinals `IPAMBlock.iter_allocations` yields, without formatting their IPs (the watcher builds
    # one record per block event: the IP strings were most of its cost).
    seq = block.sequence_number_for_allocation
    slots: dict[int, Slot] = {}
    for ordinal, index in enumerate(block.allocations):
        if index is None:
            continue
        attr = block.attributes[index]
        if attr.handle_id is not None:
            slots[ordinal] = Slot(attr.handle_id, seq.get(ordinal, 0), gc_attrs(attr.secondary))
    in_use = sum(1 for o in block.allocations if o is not None)
    cooling = cooling_since(block.attributes, block.allocations) if in_use > len(slots) else None
    return BlockRecord(block.resource_version, block.uid, block.host, in_use, slots, cooling)


def encode_slot(slot: Slot) -> bytes:
    return pack([slot.handle, slot.sequence_number, dict(slot.attrs)])


# A slot decoded straight into its typed fields (msgspec checks the types in C): ~0.5 µs against ~3 µs
# for msgpack's generic unpack and the per-field checks.  The watcher decodes the old slot of every
# allocation a block event changes.
_slot_decoder = msgspec.msgpack.Decoder(tuple[str, int, dict[str, str]])


def decode_slot(data: bytes) -> Slot:
    kind = "block slot"
    if not isinstance(data, bytes | bytearray | memoryview):
        raise WrongRecordShape(kind, f"expected bytes, got {type(data).__name__}")
    if not data:
        raise TruncatedRecord(kind, "empty value")
    try:
        handle, seq, attrs = _slot_decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise WrongRecordShape(kind, f"not [handle, seq, attrs]: {exc}") from None
    except msgspec.DecodeError as exc:
        text = str(exc)
        raise (TruncatedRecord if "truncated" in text else NotMsgpack)(kind, text) from None
    return Slot(handle, seq, attrs)


def _slot(kind: str, s: list[object]) -> Slot:
    return Slot(
        as_str(kind, "handle", s[0]), as_int(kind, "sequence number", s[1]), as_str_map(kind, "attrs", s[2])
    )


def in_ordinal_order(slots: Mapping[int, bytes]) -> dict[int, bytes]:
    """`slots` as a dict in ordinal order: itself when it is one already (the ordinals sorted and compared
    in C: 1.0–1.2 µs at 50 slots), else rebuilt (sorting the ordinals, not the (ordinal, bytes) pairs:
    4.8–6.4 µs against 7.5–8.3 for `dict(sorted(slots.items()))`, measured side by side)."""
    order = sorted(slots)
    if type(slots) is dict and order == list(slots):
        return slots
    return dict(zip(order, map(slots.__getitem__, order), strict=True))


def encode_block_packed(
    resource_version: str,
    uid: str,
    host: str | None,
    in_use: int,
    slots: Mapping[int, bytes],
    cooling_since: float | None = None,
) -> bytes:
    """A block record from slots already packed (`encode_slot`): the watcher's hot path.  Slots in ordinal
    order, so the same block always has the same bytes, however its slots came and went (a dict already in
    that order, as the watcher keeps its blocks' slots, is packed as it is)."""
    fields: list[object] = [BLOCK_VERSION, resource_version, uid, host, in_use, in_ordinal_order(slots)]
    if cooling_since is not None:
        fields.append(cooling_since)  # only blocks that cool carry it
    return pack(fields)


def encode_block(rec: BlockRecord) -> bytes:
    packed = {o: encode_slot(s) for o, s in rec.slots.items()}
    return encode_block_packed(rec.resource_version, rec.uid, rec.host, rec.in_use, packed, rec.cooling_since)


def decode_block(data: bytes) -> BlockRecord:
    return decode_block_packed(data)[0]


def _block_fields(data: bytes) -> list[Any]:
    """A block record's fields, version 1 or 2 (6 or 7 of them), the slots not yet read."""
    value = unpack("block", data)
    version = value[0] if isinstance(value, list) and value else None
    arity = 7 if isinstance(value, list) and len(value) == 7 else 6
    return record_fields("block", value, 1 if version == 1 else BLOCK_VERSION, arity)


def decode_block_version(data: bytes) -> str:
    """A block record's resourceVersion alone, its slots left packed (the workers compare only that)."""
    return as_str("block", "resourceVersion", _block_fields(data)[1])


# A block record's head read without its slots (each a packed map of ~50 attributes at a /26): the
# fields as raw msgpack, then only those the reader wants.  Whatever this refuses is read whole
# (`decode_block`), whose error names the field.
_FIELDS_RAW = msgspec.msgpack.Decoder(list[msgspec.Raw])
_PACKED_SLOTS = msgspec.msgpack.Decoder(dict[int, bytes])
_INT = msgspec.msgpack.Decoder(int)
_TEXT = msgspec.msgpack.Decoder(str)
_OPT_TEXT = msgspec.msgpack.Decoder(str | None)
_NUMBER = msgspec.msgpack.Decoder(float)


class BlockHead(NamedTuple):
    host: str | None
    in_use: int


def decode_block_head(data: bytes) -> BlockHead:
    """A block record's host and in-use count, its slots checked to be a map of packed slots but not
    decoded: the leader's backstop scan of every block reads only these (decoding every slot of 5,000
    blocks was 73 % of the leader's py-spy samples in a 150k-pod cold start).  A record `decode_block`
    would refuse for its head or the shape of its slots is refused alike (its error); one whose slots
    hold bytes that are not a slot is not looked into: the scan only nominates (every release re-reads
    the live block)."""
    try:
        v = _FIELDS_RAW.decode(data) if isinstance(data, bytes) else None
        if v is not None and len(v) in (6, 7) and _INT.decode(v[0]) == BLOCK_VERSION:
            _TEXT.decode(v[1])  # resourceVersion
            _TEXT.decode(v[2])  # uid
            _PACKED_SLOTS.decode(v[5])
            if len(v) == 7:
                _NUMBER.decode(v[6])  # cooling since
            return BlockHead(_OPT_TEXT.decode(v[3]), _INT.decode(v[4]))
    except (msgspec.DecodeError, msgspec.ValidationError):
        pass
    rec = decode_block(data)  # another version, or a shape the above refuses: read whole (or raise)
    return BlockHead(rec.host, rec.in_use)


def decode_block_packed(data: bytes) -> tuple[BlockRecord, dict[int, bytes]]:
    """The record and each slot's packed form (`encode_slot`, as stored when the record is version 2):
    what the watcher holds of a block it loads from Redis, without re-packing every slot."""
    kind = "block"
    v = _block_fields(data)
    version = v[0]
    raw_slots = v[5]
    if not isinstance(raw_slots, dict):
        raise WrongRecordShape(kind, "slots is not a map")
    slots: dict[int, Slot] = {}
    packed: dict[int, bytes] = {}
    for o, s in raw_slots.items():
        ordinal = as_int(kind, "ordinal", o)
        if version == 1:
            if not isinstance(s, list) or len(s) != 3:
                raise WrongRecordShape(kind, f"slot {ordinal} is not [handle, seq, attrs]")
            slots[ordinal] = slot = _slot(kind, s)
            packed[ordinal] = encode_slot(slot)
        elif isinstance(s, bytes):
            slots[ordinal] = decode_slot(s)
            packed[ordinal] = s
        else:
            raise WrongRecordShape(kind, f"slot {ordinal} is not packed bytes")
    record = BlockRecord(
        resource_version=as_str(kind, "resourceVersion", v[1]),
        uid=as_str(kind, "uid", v[2]),
        host=as_opt_str(kind, "host", v[3]),
        in_use=as_int(kind, "in use", v[4]),
        slots=slots,
        cooling_since=as_float(kind, "cooling since", v[6]) if len(v) == 7 else None,
    )
    return record, packed


# A fingerprint of an attribute's JSON bytes (`bytes` or a `msgspec.Raw`): their 64-bit XXH3, a C callable
# that `producer/slim.py` maps over a block's attributes.  xxhash reads a `msgspec.Raw` view in place (no
# copy to `bytes` first) and is several times faster than Python's SipHash on a ~200-byte attribute.  Two
# different attributes printing alike (2^-64 a changed ordinal) would leave the old slot mirrored until the
# ordinal changes again; the leader's live re-check refuses a release whose live attributes differ from the
# mirror's (`workers/leader/release.py`), so that costs a late release at worst, never a wrong one.  Never
# stored: prints only compare two events of one block within one watcher process.  Unseeded (a seed is a
# keyword argument, and passing it made each call slower than the SipHash this replaced), so attributes could
# be crafted to print alike: that too can only delay a release.
attr_print: Callable[[bytes | msgspec.Raw], int] = xxhash.xxh3_64_intdigest

# A block's sequence numbers per ordinal, as `LeanBlock` keeps them: 8 bytes an ordinal in one array (0 where
# the block gives none, as `raw` reads a missing one), or, for a number that does not fit 64 bits (no
# Calico writes one), the block's map as it is.  As maps of Python ints they were most of the 12.9 MB that
# tracemalloc put on the blocks' decoding at 150,000 pods, and with the prints' arrays the watcher's
# process held 188 MiB after a cold start instead of 204–209 (docs/benchmarks.md, "Memory at 150,000
# pods, taken apart").
Seqs: TypeAlias = "array[int] | Mapping[int, int]"  # a string: array is subscriptable from Python 3.12


def dense_seqs(seqs: Mapping[int, int], size: int) -> Seqs:
    """`seqs` as one array of `size`; the map as it is when an ordinal is outside [0, size) or a number
    outside [0, 2^64)."""
    if seqs and (min(seqs) < 0 or max(seqs) >= size):
        return dict(seqs)
    try:
        return array("Q", map(seqs.get, range(size), repeat(0)))  # in C: ~4 µs for a /26
    except OverflowError:
        return dict(seqs)


def print_array(prints: Sequence[int | None]) -> array[int]:
    """Per ordinal, its attribute's print, 0 where unallocated: 8 bytes an ordinal in one array."""
    return array("Q", [0 if p is None else p for p in prints])


@dataclass(frozen=True, slots=True)
class LeanBlock:
    """A block event as the watcher diffs it: every ordinal's attribute as the JSON bytes the API server
    sent, not yet decoded, and the sequence numbers.  An ordinal whose bytes and sequence number equal
    what the watcher holds did not change and is never decoded; the changed ones are decoded
    (`producer/slim.py` `slot_of_attr`) with the checks `shared.parse` makes, so a block costs what changed
    in it.  `in_use` counts every non-null ordinal (an attribute with no handle included), as
    `BlockRecord.in_use`.

    `attrs` is per ordinal (the block's size long): its attribute's JSON (`bytes`, or a `msgspec.Raw`
    view of the event's bytes), None where unallocated.  `prints` is the same per ordinal as a
    fingerprint of those bytes (`attr_print`; 0 where unallocated: an attribute printing 0, 2^-64, would
    look unallocated, and its allocation also changes the ordinal's sequence number), computed with them,
    one array (`print_array`), as the sequence numbers are (`Seqs`); two events are compared print by
    print in C (`producer/blockdiff.py`), not through a dict built per event, and equality of two lean
    blocks compares prints, not bytes.  What the watcher holds of a block is `held()`: the prints
    without the bytes.  The bytes were views of the event they came in, and kept that event alive: a
    list page of ~4 MB per 500 blocks, then each block's last watch event (~13 KB at 64 ordinals), ~60
    MiB at 150k pods (docs/benchmarks-history.md).  `prints` None: nothing is known of the bytes (a block
    loaded from Redis): every ordinal counts as changed."""

    resource_version: str
    uid: str
    host: str | None  # `host:` affinity only
    in_use: int
    attrs: Sequence[object | None] | None = field(compare=False)
    seqs: Seqs  # ordinal → sequence number, as the block gives it (missing: 0)
    cooling_since: float | None = None  # as `BlockRecord.cooling_since`
    prints: Sequence[int] | None = None

    def __post_init__(self) -> None:
        if self.attrs is not None and self.prints is None:  # never bytes without their prints
            prints = print_array([None if a is None else attr_print(a) for a in self.attrs])  # type: ignore[arg-type]
            object.__setattr__(self, "prints", prints)

    def held(self) -> LeanBlock:
        """What the watcher keeps of this event: everything but the attribute bytes."""
        if self.attrs is None:
            return self
        return LeanBlock(
            self.resource_version, self.uid, self.host, self.in_use, None, self.seqs, self.cooling_since,
            self.prints,
        )  # fmt: skip

    def raw(self, ordinal: int) -> tuple[object, int] | None:
        """An allocated ordinal's (attribute JSON, sequence number); None if unallocated or not known."""
        attr = self.attrs[ordinal] if self.attrs is not None and 0 <= ordinal < len(self.attrs) else None
        if attr is None:
            return None
        seqs = self.seqs
        if isinstance(seqs, array):
            return attr, seqs[ordinal] if ordinal < len(seqs) else 0
        return attr, seqs.get(ordinal, 0)

    def allocated(self) -> list[int]:
        """The ordinals with an attribute (in order); [] when no bytes are known."""
        if self.attrs is None:
            return []
        return [o for o, a in enumerate(self.attrs) if a is not None]


@dataclass(frozen=True, slots=True)
class MirroredBlock:
    """A block as the watcher mirrors it, typed straight from its JSON (`producer/slim.py`) without the
    full `IPAMBlock` in between: its CIDR, whether it is soft-deleted, and its lean record.  Its slots,
    decoded, equal `block_record(parse_block(raw))` for every block `parse_block` accepts (by test)."""

    cidr_str: str
    deleted: bool
    record: LeanBlock
