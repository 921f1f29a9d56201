"""The records ipamgc mirrors into Redis, and their msgpack form (version tag first, then positional fields).

Records hold only what validation and release read, so Redis memory follows the allocation count and not
the size of Kubernetes objects: an allocation keeps its GC attributes (`node`, `namespace`, `pod`, `type`,
`vmi-name`; the CNI timestamp is dropped), a pod its slim fields, a node its uid and the flannel-migration
label.  The key that stores a record carries its identity (alloc id `<handle>/<ip>`, pod `<ns>/<name>`,
node name, block CIDR), so it is not repeated inside.  Decoding bad bytes raises a `shared.codec`
`RecordError`.  Layouts are described per function; bump the version when one changes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgpack  # type: ignore[import-untyped]
import msgspec

from shared.blockops import released_at_seconds
from shared.codec import (
    NotMsgpack,
    TruncatedRecord,
    WrongRecordShape,
    as_bool,
    as_float,
    as_int,
    as_opt_str,
    as_str,
    as_str_list,
    as_str_map,
    pack,
    record_fields,
    unpack,
    unpack_record,
)
from shared.kubevirt import VirtualMachine, VirtualMachineInstance
from shared.model import (
    ATTR_NAMESPACE,
    ATTR_NODE,
    ATTR_POD,
    ATTR_TYPE,
    ATTR_VMI_NAME,
    LABEL_NODE_NETWORK_DURING_MIGRATION,
    Allocation,
    Attribute,
    IPAMBlock,
    Node,
    Pod,
)

VERSION = 1

# The allocation attributes the rules read (classification, owner lookup, shard).  Others are dropped.
GC_ATTRS = (ATTR_NODE, ATTR_NAMESPACE, ATTR_POD, ATTR_TYPE, ATTR_VMI_NAME)
# The node labels the rules read (empty-block release during flannel migration).
NODE_LABELS = (LABEL_NODE_NETWORK_DURING_MIGRATION,)


def gc_attrs(attrs: Mapping[str, str]) -> dict[str, str]:
    return {k: attrs[k] for k in GC_ATTRS if k in attrs}


def split_alloc_id(alloc_id: str) -> tuple[str, str]:
    """`<handle>/<ip>` → (handle, ip).  IPs hold no `/`, so the last one separates them."""
    handle, sep, ip = alloc_id.rpartition("/")
    if not sep or not handle or not ip:
        raise WrongRecordShape("allocation", f"bad allocation id {alloc_id!r}")
    return handle, ip


# -- allocation: [v, block, ordinal, sequence number, gc attrs] ------------------------------------------


def encode_allocation(a: Allocation) -> bytes:
    return pack([VERSION, a.block, a.ordinal, a.sequence_number, gc_attrs(a.attrs)])


def decode_allocation(alloc_id: str, data: bytes) -> Allocation:
    kind = "allocation"
    v = unpack_record(kind, data, VERSION, 5)
    handle, ip = split_alloc_id(alloc_id)
    return Allocation(
        ip=ip,
        ordinal=as_int(kind, "ordinal", v[2]),
        block=as_str(kind, "block", v[1]),
        handle=handle,
        attrs=as_str_map(kind, "attrs", v[4]),
        sequence_number=as_int(kind, "sequence number", v[3]),
    )


# -- block: [2, resourceVersion, uid, host | nil, in use, {ordinal: bin(slot)}(, cooling since)] ----------
# A slot is packed on its own (`encode_slot`: [handle, seq, gc attrs]) so that the watcher re-packs only the
# ordinals an event changed and writes the rest as the bytes it already holds.  Only blocks with IPs in
# cooldown carry the seventh field.  Version 1 held the slots as nested arrays; it is still read (a Redis
# written by an older watcher).

BLOCK_VERSION = 2


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


def encode_block_packed(
    resource_version: str,
    uid: str,
    host: str | None,
    in_use: int,
    slots: Mapping[int, bytes],
    cooling_since: float | None = None,
) -> bytes:
    """A block record from slots already packed (`encode_slot`): the watcher's hot path.  Slots in ordinal
    order, so the same block always has the same bytes, however its slots came and went."""
    fields: list[object] = [BLOCK_VERSION, resource_version, uid, host, in_use, dict(sorted(slots.items()))]
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


# -- pod: [v, uid, nodeName, phase, reason, podIP, podIPs, annotations, being deleted, hostNetwork] --------


def encode_pod(pod: Pod) -> bytes:
    return pack(
        [
            VERSION,
            pod.uid,
            pod.node_name,
            pod.phase,
            pod.reason,
            pod.pod_ip,
            list(pod.pod_ips),
            dict(sorted(pod.annotations.items())),  # one order, however the object listed them
            pod.deletion_timestamp,
            pod.host_network,
        ]
    )


def decode_pod(namespace: str, name: str, data: bytes) -> Pod:
    kind = "pod"
    v = unpack_record(kind, data, VERSION, 10)
    return Pod(
        namespace=namespace,
        name=name,
        uid=as_str(kind, "uid", v[1]),
        node_name=as_str(kind, "nodeName", v[2]),
        phase=as_str(kind, "phase", v[3]),
        reason=as_str(kind, "reason", v[4]),
        pod_ip=as_str(kind, "podIP", v[5]),
        pod_ips=tuple(as_str_list(kind, "podIPs", v[6])),
        annotations=as_str_map(kind, "annotations", v[7]),
        deletion_timestamp=as_bool(kind, "deletionTimestamp", v[8]),
        host_network=as_bool(kind, "hostNetwork", v[9]),
    )


# -- node: [v, uid, kept labels] ---------------------------------------------------------------------------


def encode_node(node: Node) -> bytes:
    labels = {k: node.labels[k] for k in NODE_LABELS if k in node.labels}
    return pack([VERSION, node.uid, labels])


def decode_node(name: str, data: bytes) -> Node:
    kind = "node"
    v = unpack_record(kind, data, VERSION, 3)
    return Node(name=name, uid=as_str(kind, "uid", v[1]), labels=as_str_map(kind, "labels", v[2]))


# -- candidate timer: [v, first seen invalid, sequence number it was seen with] ----------------------------


@dataclass(frozen=True, slots=True)
class Candidate:
    first_seen: float
    sequence_number: int


def encode_candidate(c: Candidate) -> bytes:
    return pack([VERSION, c.first_seen, c.sequence_number])


def decode_candidate(data: bytes) -> Candidate:
    kind = "candidate"
    v = unpack_record(kind, data, VERSION, 3)
    return Candidate(as_float(kind, "first seen", v[1]), as_int(kind, "sequence number", v[2]))


# -- decided marker: [v, sequence number decided, emitted at] ----------------------------------------------


@dataclass(frozen=True, slots=True)
class Decided:
    sequence_number: int
    emitted_at: float


def encode_decided(d: Decided) -> bytes:
    return pack([VERSION, d.sequence_number, d.emitted_at])


def decode_decided(data: bytes) -> Decided:
    kind = "decided"
    v = unpack_record(kind, data, VERSION, 3)
    return Decided(as_int(kind, "sequence number", v[1]), as_float(kind, "emitted at", v[2]))


# -- release decision (stream entry field `d`) -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Decision:
    """A confirmed leak, with the evidence it was confirmed on.  The leader re-checks before releasing."""

    alloc_id: str
    ip: str
    handle: str
    block: str
    node: str
    ordinal: int
    sequence_number: int
    block_resource_version: str  # as mirrored when decided ("" if the block record was unreadable)
    type: str  # AllocationType value
    reason: str  # Reason value
    node_exists: bool
    pod: Mapping[str, str]  # lookup (found/missing/unknown/none), uid, node, phase, ips (comma-joined)
    first_seen: float
    decided_at: float
    shard: int


def encode_decision(d: Decision) -> bytes:
    return pack(
        [
            VERSION,
            d.alloc_id,
            d.ip,
            d.handle,
            d.block,
            d.node,
            d.ordinal,
            d.sequence_number,
            d.block_resource_version,
            d.type,
            d.reason,
            d.node_exists,
            dict(d.pod),
            d.first_seen,
            d.decided_at,
            d.shard,
        ]
    )


def decode_decision(data: bytes) -> Decision:
    kind = "decision"
    v = unpack_record(kind, data, VERSION, 16)
    return Decision(
        alloc_id=as_str(kind, "id", v[1]),
        ip=as_str(kind, "ip", v[2]),
        handle=as_str(kind, "handle", v[3]),
        block=as_str(kind, "block", v[4]),
        node=as_str(kind, "node", v[5]),
        ordinal=as_int(kind, "ordinal", v[6]),
        sequence_number=as_int(kind, "sequence number", v[7]),
        block_resource_version=as_str(kind, "resourceVersion", v[8]),
        type=as_str(kind, "type", v[9]),
        reason=as_str(kind, "reason", v[10]),
        node_exists=as_bool(kind, "node exists", v[11]),
        pod=as_str_map(kind, "pod", v[12]),
        first_seen=as_float(kind, "first seen", v[13]),
        decided_at=as_float(kind, "decided at", v[14]),
        shard=as_int(kind, "shard", v[15]),
    )


# -- empty block (`P:empty`): [v, host node, since] --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EmptyBlock:
    """A `host:`-affine block the watcher saw with no allocation: its host, and since when (epoch s, the
    watcher's clock) it has been empty without interruption.  A block used and emptied again gets a new
    `since`, so the leader restarts its release timer (Calico's `markInUse` on every non-empty update)."""

    host: str
    since: float


def encode_empty(e: EmptyBlock) -> bytes:
    return pack([VERSION, e.host, e.since])


def decode_empty(data: bytes) -> EmptyBlock:
    kind = "empty block"
    v = unpack_record(kind, data, VERSION, 3)
    return EmptyBlock(host=as_str(kind, "host", v[1]), since=as_float(kind, "since", v[2]))


# -- the handle index (`P:handles`) -------------------------------------------------------------------------
# One ZSET member per allocation, all at score 0, so that ZRANGE BYLEX over a handle's prefix lists exactly
# its allocations: msgpack strings are length-prefixed, so no handle's encoding is a prefix of another's,
# and every member of a handle sorts between the encoded handle and that followed by 0xff (what follows
# the handle is a msgpack str header, never 0xff).


def encode_handle_member(handle: str, field: str, node: str) -> bytes:
    """`handle` sanitised; `field` = `shared.keys.handle_field(alloc id)`; `node` its node attribute.
    The three strings packed as one array, its one-byte header (fixarray 3) cut off: one call, the same
    bytes as three."""
    return pack((handle, field, node))[1:]


def handle_member_range(handle: str) -> tuple[bytes, bytes]:
    """ZRANGE … BYLEX bounds of every member of `handle`."""
    prefix = pack(handle)
    return b"[" + prefix, b"(" + prefix + b"\xff"


def decode_handle_member(data: bytes) -> tuple[str, str, str]:
    """(handle, field, node) of a member; a `RecordError` when it is not three msgpack strings."""
    kind = "handle index member"
    if not isinstance(data, bytes):
        raise WrongRecordShape(kind, f"expected bytes, got {type(data).__name__}")
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=max(16, len(data)))
    unpacker.feed(data)
    try:
        parts = list(unpacker)
    except (ValueError, TypeError, msgpack.exceptions.UnpackException) as exc:
        raise WrongRecordShape(kind, str(exc)) from exc
    if len(parts) != 3 or not all(isinstance(x, str) for x in parts):
        raise WrongRecordShape(kind, "expected three strings (handle, field, node)")
    handle, field, node = parts
    if encode_handle_member(handle, field, node) != data:  # trailing bytes, or not the canonical form
        raise WrongRecordShape(kind, "not exactly three msgpack strings")
    return handle, field, node


def attr_print(attr: object) -> int:
    """A fingerprint of an attribute's JSON bytes (`bytes` or a `msgspec.Raw`): their 64-bit hash.  Two
    different attributes printing alike (2^-64 a changed ordinal) would leave the old slot mirrored until
    the ordinal changes again; the leader's live re-check refuses a release whose live attributes differ
    from the mirror's (`workers/release.py`), so that costs a late release at worst, never a wrong one.
    Process-local (the hash is salted per process): never stored."""
    return hash(bytes(attr))  # type: ignore[call-overload]


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
    fingerprint of those bytes (`attr_print`), computed with them; two events are compared print by
    print in C (`producer/blockdiff.py`), not through a dict built per event, and equality of two lean
    blocks compares prints, not bytes.  What the watcher holds of a block is `held()`: the prints
    without the bytes.  The bytes were views of the event they came in, and kept that event alive: a
    list page of ~4 MB per 500 blocks, then each block's last watch event (~13 KB at 64 ordinals), ~60
    MiB at 150k pods (docs/benchmarks.md).  `prints` None: nothing is known of the bytes (a block
    loaded from Redis): every ordinal counts as changed."""

    resource_version: str
    uid: str
    host: str | None  # `host:` affinity only
    in_use: int
    attrs: Sequence[object | None] | None = field(compare=False)
    seqs: Mapping[int, int]  # ordinal → sequence number, as the block gives it (missing: 0)
    cooling_since: float | None = None  # as `BlockRecord.cooling_since`
    prints: Sequence[int | None] | None = None

    def __post_init__(self) -> None:
        if self.attrs is not None and self.prints is None:  # never bytes without their prints
            prints = [None if a is None else attr_print(a) for a in self.attrs]
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
        return None if attr is None else (attr, self.seqs.get(ordinal, 0))

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


# -- KubeVirt (only what the VM rule reads, `shared/kubevirt.py`): VM [v]; VMI [v, owned by a VM] --------


def encode_vm(vm: VirtualMachine) -> bytes:
    return pack([VERSION])


def decode_vm(data: bytes) -> None:
    """Checks a VM record (it says only that the VM exists)."""
    unpack_record("vm", data, VERSION, 1)


def encode_vmi(vmi: VirtualMachineInstance) -> bytes:
    return pack([VERSION, vmi.owned_by_vm])


def decode_vmi(data: bytes) -> bool:
    """Whether the VMI is owned by a VirtualMachine."""
    v = unpack_record("vmi", data, VERSION, 2)
    return as_bool("vmi", "owned by vm", v[1])
