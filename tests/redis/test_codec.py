"""Records survive a round trip, and bad bytes raise a named PermanentError, never anything else."""

from __future__ import annotations

import contextlib

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared import codec
from shared.blockrecords import (
    BlockRecord,
    Slot,
    decode_block,
    decode_block_packed,
    decode_block_version,
    encode_block,
    encode_slot,
)
from shared.errors import PermanentError
from shared.gcrecords import (
    Candidate,
    Decided,
    Decision,
    decode_candidate,
    decode_decided,
    decode_decision,
    encode_candidate,
    encode_decided,
    encode_decision,
    encode_handle_member,
)
from shared.model import Allocation, Node, Pod
from shared.records import (
    decode_allocation,
    decode_node,
    decode_pod,
    encode_allocation,
    encode_node,
    encode_pod,
)

ALLOC = Allocation(
    ip="fd00:10:244::1",
    ordinal=1,
    block="fd00:10:244::/122",
    handle="k8s-pod-network.abc",
    attrs={"node": "node-1", "namespace": "default", "pod": "web-0"},
    sequence_number=1_737_481_904_000_000_007,
)
POD = Pod(
    namespace="default",
    name="web-0",
    uid="u-1",
    node_name="node-1",
    phase="Running",
    pod_ip="10.244.0.2",
    pod_ips=("10.244.0.2", "fd00:10:244::1"),
    annotations={"cni.projectcalico.org/podIP": "10.244.0.2/32"},
)
DECISION = Decision(
    alloc_id=ALLOC.id,
    ip=ALLOC.ip,
    handle=ALLOC.handle,
    block=ALLOC.block,
    node="node-1",
    ordinal=1,
    sequence_number=ALLOC.sequence_number,
    block_resource_version="123",
    type="pod",
    reason="pod-missing",
    node_exists=True,
    pod={"lookup": "missing"},
    first_seen=1.5,
    decided_at=902.5,
    shard=15,
)

DECODERS = [
    lambda b: decode_allocation(ALLOC.id, b),
    decode_block,
    decode_block_version,
    lambda b: decode_pod("default", "web-0", b),
    lambda b: decode_node("node-1", b),
    decode_candidate,
    decode_decided,
    decode_decision,
]


def test_records_round_trip() -> None:
    assert decode_allocation(ALLOC.id, encode_allocation(ALLOC)) == ALLOC
    assert decode_pod("default", "web-0", encode_pod(POD)) == POD
    node = Node("node-1", {"projectcalico.org/node-network-during-migration": "flannel"}, uid="n-1")
    assert decode_node("node-1", encode_node(node)) == node
    block = BlockRecord("9", "uid", "node-1", 2, {0: Slot("h", 5, {"node": "node-1"}), 1: Slot("g", 6, {})})
    assert decode_block(encode_block(block)) == block
    assert decode_block_version(encode_block(block)) == "9"
    # The watcher loads each slot's stored bytes as they are; a version-1 record's are packed on load.
    assert decode_block_packed(encode_block(block))[1] == {o: encode_slot(s) for o, s in block.slots.items()}
    v1 = codec.pack(
        [
            1,
            "9",
            "uid",
            "node-1",
            2,
            {o: [s.handle, s.sequence_number, dict(s.attrs)] for o, s in block.slots.items()},
        ]
    )
    assert decode_block_packed(v1) == (block, {o: encode_slot(s) for o, s in block.slots.items()})
    assert decode_block_version(v1) == "9"
    assert decode_candidate(encode_candidate(Candidate(1.25, 7))) == Candidate(1.25, 7)
    assert decode_decided(encode_decided(Decided(7, 3.0))) == Decided(7, 3.0)
    assert decode_decision(encode_decision(DECISION)) == DECISION


def test_allocation_record_keeps_only_the_gc_attributes() -> None:
    noisy = Allocation(
        **{**_fields(ALLOC), "attrs": {**ALLOC.attrs, "timestamp": "2025-01-21 17:51:44 +0000 UTC"}}
    )
    assert decode_allocation(ALLOC.id, encode_allocation(noisy)).attrs == ALLOC.attrs


def _fields(a: Allocation) -> dict[str, object]:
    return {f: getattr(a, f) for f in ("ip", "ordinal", "block", "handle", "attrs", "sequence_number")}


@pytest.mark.parametrize(
    "data, error",
    [
        (encode_allocation(ALLOC)[:-3], codec.TruncatedRecord),
        (b"", codec.TruncatedRecord),
        (b"\xc1", codec.NotMsgpack),
        (encode_allocation(ALLOC) + b"\x00", codec.NotMsgpack),
        (msgpack.packb([2, "b", 1, 2, {}]), codec.UnknownRecordVersion),
        (msgpack.packb({"v": 1}), codec.WrongRecordShape),
        (msgpack.packb([1, "b", "one", 2, {}]), codec.WrongRecordShape),
        (msgpack.packb([1, "b", 1, 2, {"node": 3}]), codec.WrongRecordShape),
        (msgpack.packb([1, "b", 1, 2]), codec.WrongRecordShape),
        (msgpack.packb([True, "b", 1, 2, {}]), codec.WrongRecordShape),
    ],
)
def test_bad_bytes_raise_a_named_permanent_error(data: bytes, error: type[codec.RecordError]) -> None:
    with pytest.raises(error) as info:
        decode_allocation(ALLOC.id, data)
    assert isinstance(info.value, PermanentError)


def test_a_bad_allocation_id_is_a_record_error() -> None:
    with pytest.raises(codec.WrongRecordShape):
        decode_allocation("no-slash", encode_allocation(ALLOC))


@given(st.binary(max_size=64), st.sampled_from(range(len(DECODERS))))
def test_arbitrary_bytes_never_crash_a_decoder(data: bytes, which: int) -> None:
    with contextlib.suppress(codec.RecordError):
        DECODERS[which](data)


@given(
    st.integers(min_value=0, max_value=2**63 - 1),
    st.dictionaries(st.sampled_from(["node", "namespace", "pod", "type", "vmi-name"]), st.text(max_size=20)),
)
def test_allocation_round_trip_property(seq: int, attrs: dict[str, str]) -> None:
    a = Allocation(**{**_fields(ALLOC), "sequence_number": seq, "attrs": attrs})
    assert decode_allocation(a.id, encode_allocation(a)) == a


_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary(),
    lambda inner: (
        st.lists(inner, max_size=20)
        | st.dictionaries(st.text() | st.integers(min_value=0, max_value=2**16), inner, max_size=20)
    ),
    max_leaves=60,
)


@given(_values)
def test_pack_writes_the_bytes_msgpack_writes(value: object) -> None:
    """`codec.pack` (msgspec's encoder) is byte for byte `msgpack.packb(use_bin_type=True)`: records
    written before the switch, and the handle index's members compared as bytes, stay the same."""
    assert codec.pack(value) == msgpack.packb(value, use_bin_type=True)


@given(st.text(), st.text(), st.text())
def test_a_handle_member_is_its_three_strings_packed_one_after_another(h: str, f: str, n: str) -> None:
    assert encode_handle_member(h, f, n) == b"".join(msgpack.packb(x, use_bin_type=True) for x in (h, f, n))
