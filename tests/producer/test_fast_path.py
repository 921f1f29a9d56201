"""The watcher's fast path (`producer/slim.py`: msgspec straight from bytes) decides exactly as the generic
path (orjson + `shared.parse`): on every object the generic path accepts, the same slim pod and the same
block record; on every object it refuses, no fast result at all (the caller then takes the generic path,
which names the problem).  Fuzzed from valid objects with one value broken, as the parsers' own fuzzing."""

from __future__ import annotations

import copy
import json
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lab.cluster.objects import ClusterBuilder
from producer import slim, slimpods
from producer.blockdiff import BlockDiff
from producer.kinds import Kind
from producer.memory import HeldBlock
from producer.typed import convert, fast_typed
from shared.blockrecords import LeanBlock, Slot, block_record, dense_seqs, encode_slot
from shared.errors import MalformedObject
from shared.parse import parse_block, parse_pod
from tests.shared.test_fuzz_parsers import FUZZ, GOOD, broken


def _bytes(raw: Any) -> bytes:
    """As the API server sends it (stdlib json: integers of any size, as the fuzzer makes them)."""
    return json.dumps(raw).encode()


def _generic_block(raw: Any) -> Any:
    try:
        b = parse_block(raw)
    except MalformedObject:
        return None
    return b.cidr_str, b.deleted, block_record(b)


def _generic_pod(raw: Any) -> Any:
    try:
        return parse_pod(raw)
    except MalformedObject:
        return None


def _fast_block(raw: Any) -> Any:
    """The fast path's lean record with every slot decoded, as the watcher decodes the ones that change
    (a malformed attribute refuses the block then: None here)."""
    got = slim.block(_bytes(raw))
    if got is None:
        return None
    b, _ = got
    record = slim.materialize(b.record)
    return None if record is None else (b.cidr_str, b.deleted, record)


def _fast_pod(raw: Any) -> Any:
    got = slimpods.pod(_bytes(raw))
    return None if got is None else got[0]


@FUZZ
@given(raw=broken("IPAMBlock"))
def test_a_fast_block_equals_the_generic_one_or_is_refused(raw: Any) -> None:
    fast, generic = _fast_block(raw), _generic_block(raw)
    assert fast is None or fast == generic  # never accepted where the generic path refuses or differs


@FUZZ
@given(raw=broken("Pod"))
def test_a_fast_pod_equals_the_generic_one_or_is_refused(raw: Any) -> None:
    fast, generic = _fast_pod(raw), _generic_pod(raw)
    assert fast is None or fast == generic


def test_valid_objects_take_the_fast_path() -> None:
    """What a cluster sends (the simulator's Calico objects) is never left to the slow path."""
    b = ClusterBuilder()
    b.add_node("node-1")
    for i in range(40):
        b.add_pod("default", f"p{i}", "node-1", dual_stack=i % 2 == 0)
    b.delete_pod("default", "p3", cni_del=False)
    blocks = list(b.ipam.blocks.values())
    assert blocks
    for raw in blocks:
        assert _fast_block(raw) == _generic_block(raw) is not None
    for raw in b.pods.values():
        assert _fast_pod(raw) == _generic_pod(raw) is not None
    pod = copy.deepcopy(GOOD["Pod"])
    pod["metadata"]["managedFields"] = [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}]
    pod["metadata"]["annotations"] = {"b": "x", "cni.projectcalico.org/podIP": "10.244.0.9/32"}
    assert _fast_pod(pod) == _generic_pod(pod) is not None


@given(kind=st.sampled_from([Kind.PODS, Kind.BLOCKS]), name=st.sampled_from(["IPAMBlock", "Pod"]))
def test_fast_typed_keys_objects_as_convert_does(kind: Kind, name: str) -> None:
    raw = GOOD[name]
    fast = fast_typed(kind, orjson.dumps(raw))
    generic = convert(kind, raw)
    if fast is None:
        return  # another kind's object: refused, the generic path names it
    typed, rv = fast
    assert typed.key == generic.key and typed.problem is None
    assert rv == raw["metadata"].get("resourceVersion", "")


def test_a_watch_line_that_is_not_an_event_is_left_to_the_generic_path() -> None:
    assert slim.envelope(b"not json") is None
    assert slim.envelope(b'{"type": "ADDED"}') is None
    assert slim.list_page(b"[1, 2]") is None


def test_the_generic_paths_lean_record_decodes_to_the_same_slots() -> None:
    """A block the generic path parsed (`slim.lean_of`) diffs as the fast path's does."""
    raw = GOOD["IPAMBlock"]
    generic = parse_block(raw)
    assert slim.materialize(slim.lean_of(generic)) == block_record(generic) == _fast_block(raw)[2]


def test_a_malformed_attribute_is_refused_when_its_slot_is_decoded() -> None:
    """The fast path does not decode every attribute: one an ordinal names is checked when the watcher
    decodes it (it changed), and refused as the generic path refuses the block."""
    raw = copy.deepcopy(GOOD["IPAMBlock"])
    raw["spec"]["attributes"][1]["secondary"]["node"] = 7
    got = slim.block(_bytes(raw))
    assert got is not None and _generic_block(raw) is None
    lean = got[0].record
    with pytest.raises(slim.BadAttribute):
        raw = lean.raw(1)
        assert raw is not None
        slim.slot_of_attr(raw)
    assert slim.materialize(lean) is None


def test_an_attribute_no_ordinal_names_is_checked_at_once() -> None:
    raw = copy.deepcopy(GOOD["IPAMBlock"])
    raw["spec"]["attributes"].append({"handle_id": 5})
    assert slim.block(_bytes(raw)) is None and _generic_block(raw) is None


def _event(raw: Any, etype: str = "MODIFIED") -> bytes:
    return b'{"type":"' + etype.encode() + b'","object":' + _bytes(raw) + b"}"


@FUZZ
@given(raw=broken("IPAMBlock"))
def test_a_block_watch_event_decoded_in_one_pass_equals_its_object_decoded_alone(raw: Any) -> None:
    """`block_event` (envelope and object in one decode) accepts exactly what `block` accepts."""
    event = slim.block_event(_event(raw))
    alone = slim.block(_bytes(raw))
    assert (event[1] if event is not None else None) == alone
    assert event is None or event[0] == "MODIFIED"


@FUZZ
@given(raw=broken("Pod"))
def test_a_pod_watch_event_decoded_in_one_pass_equals_its_object_decoded_alone(raw: Any) -> None:
    event = slimpods.pod_event(_event(raw, "ADDED"))
    alone = slimpods.pod(_bytes(raw))
    assert (event[1] if event is not None else None) == alone


def test_a_cooling_ordinal_is_found_from_the_event_as_from_the_object() -> None:
    """The `releasedAt` search runs once over the bytes: a block with a cooling ordinal still has it."""
    raw = copy.deepcopy(GOOD["IPAMBlock"])
    spec = raw["spec"]
    free = spec["unallocated"].pop(0)
    spec["attributes"].append({"releasedAt": "2026-12-01T10:00:00Z"})
    spec["allocations"][free] = len(spec["attributes"]) - 1
    event = slim.block_event(_event(raw))
    assert event is not None and event[1] is not None
    assert event[1][0].record.cooling_since is not None
    assert event[1] == slim.block(_bytes(raw))
    assert _fast_block(raw) == _generic_block(raw) is not None


def test_bookmarks_and_errors_are_left_to_the_generic_path() -> None:
    assert slim.block_event(b'{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"7"}}}') is None
    assert slimpods.pod_event(b'{"type":"ERROR","object":{"kind":"Status","code":410}}') is None


def _page(*items: Any, token: str = "") -> bytes:
    meta = {"resourceVersion": "42", **({"continue": token} if token else {})}
    page = {"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": list(items)}
    return json.dumps(page).encode()


def _item_by_item(body: bytes) -> Any:
    """A page framed, then each item typed alone: what the list path did before `pod_list_page`."""
    framed = slim.list_page(body)
    assert framed is not None
    items, rv, token = framed
    return [slimpods.pod(i) for i in items], rv, token


@FUZZ
@given(raw=broken("Pod"))
def test_a_pod_page_read_in_one_pass_equals_its_items_read_alone_or_is_refused(raw: Any) -> None:
    """`pod_list_page` gives exactly the pods `pod` gives item by item; a page with any item `pod` would
    refuse is refused whole (the caller then reads it item by item, that item through the generic path)."""
    body = _page(GOOD["Pod"], raw, token="next")
    if slim.list_page(body) is None:  # not JSON (the fuzzer's NaN): neither path reads the page
        assert slimpods.pod_list_page(body) is None
        return
    alone, rv, token = _item_by_item(body)
    got = slimpods.pod_list_page(body)
    assert (got is None) == any(a is None for a in alone)
    if got is not None:
        assert got == ([a[0] for a in alone if a is not None], rv, token)


def test_a_page_with_a_pod_the_fast_path_refuses_is_refused_whole() -> None:
    bad = copy.deepcopy(GOOD["Pod"])
    bad["status"]["podIP"] = "not-an-ip"
    assert slimpods.pod(_bytes(bad)) is None
    assert slimpods.pod_list_page(_page(GOOD["Pod"], bad)) is None
    assert slimpods.pod_list_page(b'{"items": [1]}') is None  # not pods
    good = slimpods.pod_list_page(_page(GOOD["Pod"], GOOD["Pod"]))
    assert good is not None and len(good[0]) == 2 and good[1:] == ("42", None)


def test_the_pods_of_a_cluster_are_read_in_one_pass_as_item_by_item() -> None:
    b = ClusterBuilder()
    b.add_node("node-1")
    for i in range(30):
        b.add_pod("default", f"p{i}", "node-1", dual_stack=i % 3 == 0)
    body = _page(*b.pods.values(), token="t")
    alone, rv, token = _item_by_item(body)
    assert slimpods.pod_list_page(body) == ([a[0] for a in alone if a is not None], rv, token)
    assert None not in alone and rv == "42" and token == "t"


def test_a_blocks_sequence_numbers_are_kept_in_one_array_or_as_given() -> None:
    seqs = dense_seqs({3: 7, 0: 2**64 - 1}, 8)
    assert list(seqs) == [2**64 - 1, 0, 0, 7, 0, 0, 0, 0]
    assert dense_seqs({8: 1}, 8) == {8: 1}  # an ordinal outside the block: the map as given
    assert dense_seqs({1: 2**64}, 8) == {1: 2**64}  # beyond 64 bits
    attrs = [b'{"handle_id":"h"}'] * 8
    for kept in (seqs, {3: 7, 0: 2**64 - 1}):
        lean = LeanBlock("1", "u", None, 8, attrs, kept)
        assert lean.raw(3) == (attrs[3], 7) and lean.raw(5) == (attrs[5], 0)


def test_a_changed_sequence_number_is_found_whichever_way_the_numbers_are_kept() -> None:
    """The diff picks out the ordinals whose number changed between two arrays in C, and looks at every
    ordinal when either side kept a map; either way it decodes the changed ones and finds the change."""
    attr = b'{"handle_id":"h","secondary":{"node":"n1"}}'
    attrs: list[bytes | None] = [attr, attr, None, None]
    held_lean = LeanBlock("1", "u", None, 2, attrs, dense_seqs({0: 5, 1: 6}, 4)).held()
    packed = {0: encode_slot(Slot("h", 5, {"node": "n1"})), 1: encode_slot(Slot("h", 6, {"node": "n1"}))}
    held = HeldBlock(held_lean, packed, {"n1": 2})
    for seqs in (dense_seqs({0: 5, 1: 9}, 4), {0: 5, 1: 9}, {0: 5, 1: 2**64}):
        changes = BlockDiff._decoded(held, LeanBlock("2", "u", None, 2, attrs, seqs))
        assert [(o, before.sequence_number if before else None) for o, before, _ in changes] == [(1, 6)]
        assert changes[0][2] is not None and changes[0][2].sequence_number == seqs[1]
    assert BlockDiff._decoded(held, LeanBlock("2", "u", None, 2, attrs, dense_seqs({0: 5, 1: 6}, 4))) == []


def test_a_list_of_pods_is_typed_with_its_pages_only_for_the_reflector() -> None:
    """`KubeApi.items` (`ipamgc check`, the inventory) gets raw pods whatever the page; the reflector asks
    for `typed` pages and gets `Pod`s."""
    from kubeio.watch import Page
    from producer.kube import KubeApi

    body = _page(GOOD["Pod"], GOOD["Pod"])

    class Resp:
        def __init__(self) -> None:
            self.left = [body]

        def read(self, _n: int) -> bytes:
            return self.left.pop() if self.left else b""

        def release_conn(self) -> None:
            pass

    api = KubeApi.__new__(KubeApi)
    api.page_size, api.connect_timeout, api.list_timeout = 500, 1.0, 1.0
    api._call = lambda *_args: Resp()  # type: ignore[method-assign]
    raw: list[Page] = list(api.pages(Kind.PODS))
    typed: list[Page] = list(api.pages(Kind.PODS, typed=True))
    assert [type(i).__name__ for i in raw[0].items] == ["Raw", "Raw"]
    assert [type(i).__name__ for i in typed[0].items] == ["Pod", "Pod"]
    items, rv = api.items(Kind.PODS)
    assert rv == "42" and all(isinstance(i, dict) for i in items) and len(items) == 2
