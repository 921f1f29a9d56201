"""The records ipamgc writes of its own, as opposed to mirrors of cluster objects: the workers' candidate
timers and decided markers, the release decisions they stream to the leader, and the two indexes the
watcher keeps so that the leader finds things without scanning (empty blocks, a handle's allocations).

Why a module of its own: these are the GC's state and its hand-offs between components, written and read
by ipamgc alone; their layouts change with the GC's design, not with Kubernetes or Calico objects (those
are `shared.records`, which re-exports these names: the watcher and the workers import them from there).
Same form as every record: a msgpack array, version tag first, then positional fields.  Decoding bad
bytes raises a `shared.codec` `RecordError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import msgpack  # type: ignore[import-untyped]

from shared.codec import (
    WrongRecordShape,
    as_bool,
    as_float,
    as_int,
    as_str,
    as_str_map,
    pack,
    unpack_record,
)

# The version tag of these layouts; bump it when one changes (the mirrored objects' layouts are versioned
# in `shared.records`, the block's in `shared.blockrecords`).
VERSION = 1


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
