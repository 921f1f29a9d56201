"""Records survive a round trip, and bad bytes raise a named PermanentError, never anything else."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable
from types import MappingProxyType

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared import codec
from shared.blockrecords import (
    BLOCK_VERSION,
    BlockHead,
    BlockRecord,
    Slot,
    decode_block,
    decode_block_head,
    decode_block_packed,
    decode_block_version,
    encode_block,
    encode_block_packed,
    encode_slot,
    in_ordinal_order,
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
    NODE_LABELS,
    checked_allocation,
    checked_node,
    checked_pod,
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


# A record's fields, each either of its own type or any other msgpack value: near-valid records, where a
# typed decoder and the generic checks could part ways.
_INT = st.integers(min_value=-(2**63), max_value=2**64 - 1)  # what msgpack holds
_VERSION = st.sampled_from([1, 1, 1, 2])
_FIELD_TYPES = {
    "allocation": [
        st.integers(0, 2),
        st.text(),
        _INT,
        _INT,
        st.dictionaries(st.text(), st.text()),
    ],
    "pod": [
        _VERSION,
        *[st.text()] * 5,
        st.lists(st.text()),
        st.dictionaries(st.text(), st.text()),
        st.booleans(),
        st.booleans(),
    ],
    "node": [_VERSION, st.text(), st.dictionaries(st.text(), st.text())],
}
_CHECKED = {
    "allocation": (lambda b: decode_allocation(ALLOC.id, b), lambda b: checked_allocation(ALLOC.id, b)),
    "pod": (lambda b: decode_pod("default", "web-0", b), lambda b: checked_pod("default", "web-0", b)),
    "node": (lambda b: decode_node("node-1", b), lambda b: checked_node("node-1", b)),
}


@st.composite
def _near_records(draw: st.DrawFn) -> tuple[str, bytes]:
    kind = draw(st.sampled_from(sorted(_FIELD_TYPES)))
    # Each field (the version tag too) of its type, or now and then any value; the length now and then
    # one short or one long; trailing bytes now and then.
    fields = [draw(_values) if draw(st.integers(0, 7)) == 0 else draw(t) for t in _FIELD_TYPES[kind]]
    n = len(fields)
    fields = [*fields, 1][: draw(st.sampled_from([n, n, n, n, n - 1, n + 1]))]
    return kind, codec.pack(fields) + draw(st.sampled_from([b"", b"", b"", b"\x00"]))


def _outcome(decode: Callable[[bytes], object], data: bytes) -> object:
    try:
        return decode(data)
    except codec.RecordError as exc:
        return type(exc), str(exc)


@given(_near_records())
def test_the_typed_decoders_read_what_the_checks_read_and_refuse_with_their_words(
    record: tuple[str, bytes],
) -> None:
    """The allocation, pod and node records are decoded by msgspec first; what it refuses goes through the
    generic checks.  Either way the value, or the error's type and message, is the checks' own."""
    kind, data = record
    fast, checked = _CHECKED[kind]
    assert _outcome(fast, data) == _outcome(checked, data)


_texts = st.text(max_size=8)
_maps = st.dictionaries(_texts, _texts, max_size=3)
_pods = st.builds(
    Pod,
    namespace=st.just("default"),
    name=st.just("web-0"),
    uid=_texts,
    node_name=_texts,
    host_network=st.booleans(),
    phase=_texts,
    reason=_texts,
    pod_ip=_texts,
    pod_ips=st.lists(_texts, max_size=3).map(tuple),
    annotations=_maps,
    deletion_timestamp=st.booleans(),
)
_allocations = st.builds(
    Allocation,
    ip=st.just(ALLOC.ip),
    ordinal=_INT,
    block=_texts,
    handle=st.just(ALLOC.handle),
    attrs=st.dictionaries(st.sampled_from(["node", "namespace", "pod", "type", "vmi-name"]), _texts),  # kept
    sequence_number=_INT,
)
_nodes = st.builds(
    Node, name=st.just("node-1"), labels=st.dictionaries(st.just(NODE_LABELS[0]), _texts), uid=_texts
)
_records = st.one_of(_allocations, _pods, _nodes)


@given(_records)
def test_the_typed_decoders_read_back_every_field_written(obj: Allocation | Pod | Node) -> None:
    if isinstance(obj, Allocation):
        data = encode_allocation(obj)
        assert decode_allocation(obj.id, data) == checked_allocation(obj.id, data) == obj
    elif isinstance(obj, Pod):
        data = encode_pod(obj)
        assert decode_pod("default", "web-0", data) == checked_pod("default", "web-0", data) == obj
    else:
        data = encode_node(obj)
        assert decode_node("node-1", data) == checked_node("node-1", data) == obj


_SLOT = encode_slot(Slot("k8s-pod-network.abc", 1, {"node": "node-1"}))
# A block record's fields ([version, resourceVersion, uid, host, in use, slots, cooling since]), each of its
# type or now and then any value; slots are packed slots, or now and then bytes that are not one.
_BLOCK_FIELDS = [
    st.sampled_from([1, 2, 2, 2, 3]),
    _texts,
    _texts,
    st.none() | _texts,
    _INT,
    st.dictionaries(st.integers(0, 63), st.sampled_from([_SLOT, _SLOT, b"", b"\x00"]), max_size=4),
    st.floats(allow_nan=False) | st.integers(0, 2**40),
]


@st.composite
def _near_blocks(draw: st.DrawFn) -> bytes:
    fields = [draw(_values) if draw(st.integers(0, 5)) == 0 else draw(t) for t in _BLOCK_FIELDS]
    return codec.pack(fields[: draw(st.sampled_from([5, 6, 6, 7, 7]))])


@settings(max_examples=300)
@given(_near_blocks())
def test_a_block_head_is_the_whole_records_host_and_count_and_refused_alike(data: bytes) -> None:
    """The backstop's head-only read (`decode_block_head`) gives what `decode_block` gives, and refuses
    with its error whatever it refuses for the head or the shape of the slots.  Only bytes inside a slot
    are not looked into: the one way the whole read may refuse a record whose head is read."""
    whole = _outcome(decode_block, data)
    head = _outcome(decode_block_head, data)
    if isinstance(whole, BlockRecord):
        assert head == (whole.host, whole.in_use)
    elif isinstance(head, BlockHead):
        assert "block slot record" in whole[1], whole  # type: ignore[index]
    else:
        assert head == whole


_GOOD_BLOCK = [2, "7", "u-1", "node-1", 1, {3: _SLOT}, 1.5]


@pytest.mark.parametrize("index", range(len(_GOOD_BLOCK)))
@pytest.mark.parametrize("wrong", [[], "x", True])
def test_a_block_head_refuses_each_field_of_the_wrong_type_as_the_whole_read_does(
    index: int, wrong: object
) -> None:
    fields = list(_GOOD_BLOCK)
    if isinstance(fields[index], type(wrong)) and not isinstance(wrong, bool):
        return  # the field's own type: nothing wrong
    fields[index] = wrong
    data = codec.pack(fields)
    assert decode_block_head(codec.pack(_GOOD_BLOCK)) == ("node-1", 1)
    assert isinstance(_outcome(decode_block, data), tuple)
    assert _outcome(decode_block_head, data) == _outcome(decode_block, data)


@given(st.dictionaries(st.integers(0, 63), st.binary(max_size=12), max_size=64), st.randoms())
def test_a_block_record_has_one_form_whatever_order_its_slots_came_in(
    slots: dict[int, bytes], rng: random.Random
) -> None:
    # The watcher packs its held slots as they stand when they are in ordinal order, else re-orders them:
    # either way the bytes are the sorted record's (a leader or a restarted watcher compares them).
    shuffled = list(slots.items())
    rng.shuffle(shuffled)
    reference = msgpack.packb([BLOCK_VERSION, "7", "u", "h", len(slots), dict(sorted(slots.items()))])
    for form in (dict(shuffled), dict(sorted(slots.items())), MappingProxyType(dict(shuffled))):
        assert encode_block_packed("7", "u", "h", len(slots), form) == reference
        ordered = in_ordinal_order(form)
        assert list(ordered) == sorted(slots) and ordered == slots
