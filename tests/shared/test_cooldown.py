"""IP cooldown as Calico 3.33's library does it (`allocationBlock.release`, `garbageCollect`; spec §3.12)."""

from __future__ import annotations

import copy

import orjson
import pytest

from lab.cluster.ipam import CalicoIPAM
from producer import slim
from shared.blockops import (
    ReleaseConflict,
    ReleaseRequest,
    cooling_since,
    normalize,
    release,
    released_at_seconds,
    rfc3339,
)
from shared.blockrecords import block_record, decode_block, encode_block
from shared.ipamconfig import MAX_COOLDOWN_SECONDS, parse_ipam_config
from shared.parse import parse_block
from workers.leader.cleanup import library_empty

NOW = 1_737_481_904.0
A = "k8s-pod-network.a"
B = "k8s-pod-network.b"


def _block() -> dict[str, object]:
    ipam = CalicoIPAM.with_pools(v6=None)
    ipam.assign("node-1", A, {"node": "node-1", "namespace": "ns", "pod": "a"})
    ipam.assign("node-1", B, {"node": "node-1", "namespace": "ns", "pod": "b"})
    (obj,) = ipam.blocks.values()
    return copy.deepcopy(obj)


def test_release_with_a_cooldown_parks_the_ordinal_and_restamps_its_sequence_number() -> None:
    obj = _block()
    spec = obj["spec"]
    assert isinstance(spec, dict)
    seq_before = spec["sequenceNumber"]
    free_before = list(spec["unallocated"])
    out = release(
        spec,
        [ReleaseRequest("10.244.0.0", A, spec["sequenceNumberForAllocation"]["0"])],
        cooldown=60,
        now=NOW,
    )
    new = out.spec
    assert out.released == ["10.244.0.0"] and out.handle_counts == {A: 1}
    assert new["unallocated"] == free_before  # not freed: parked
    parked = new["attributes"][new["allocations"][0]]
    assert parked == {"releasedAt": rfc3339(NOW)} and "handle_id" not in parked
    assert new["sequenceNumberForAllocation"]["0"] == seq_before  # re-stamped with the pre-write number
    assert new["sequenceNumber"] == seq_before + 1
    assert not out.empty  # a cooling ordinal keeps the block non-empty
    block = parse_block({**obj, "spec": new})
    assert [a.ip for a in block.iter_allocations()] == ["10.244.0.1"]  # never an allocation
    assert not block.is_empty and not library_empty(new)
    assert cooling_since(new) == float(int(NOW))


def test_a_cooling_ordinal_is_already_free_and_a_stale_sequence_number_conflicts() -> None:
    spec = _block()["spec"]
    assert isinstance(spec, dict)
    old_seq = spec["sequenceNumberForAllocation"]["0"]
    parked = release(spec, [ReleaseRequest("10.244.0.0", A, old_seq)], cooldown=60, now=NOW).spec
    again = release(parked, [ReleaseRequest("10.244.0.0", A)], cooldown=60, now=NOW + 1)
    assert not again.written and again.already_free == ["10.244.0.0"]
    with pytest.raises(ReleaseConflict):
        release(parked, [ReleaseRequest("10.244.0.0", A, old_seq)], cooldown=60, now=NOW + 1)


def test_normalize_returns_cooled_ordinals_only_after_the_cooldown() -> None:
    spec = _block()["spec"]
    assert isinstance(spec, dict)
    parked = release(spec, [ReleaseRequest("10.244.0.0", A)], cooldown=60, now=NOW).spec
    early = copy.deepcopy(parked)
    assert not normalize(early, 60, NOW + 60)  # released at NOW: not *before* NOW + 60 - 60
    assert early == parked
    assert normalize(parked, 60, NOW + 61)
    assert parked["unallocated"][-1] == 0 and parked["allocations"][0] is None
    assert "0" not in parked["sequenceNumberForAllocation"]
    assert all(a.get("releasedAt") is None for a in parked["attributes"])  # compacted away
    assert [parked["attributes"][i]["handle_id"] for i in parked["allocations"] if i is not None] == [B]
    assert cooling_since(parked) is None


def test_without_a_cooldown_a_release_frees_at_once_and_collects_anything_cooled() -> None:
    spec = _block()["spec"]
    assert isinstance(spec, dict)
    parked = release(spec, [ReleaseRequest("10.244.0.0", A)], cooldown=60, now=NOW).spec
    # The operator sets the cooldown back to 0: the next write frees both, in ordinal order.
    out = release(parked, [ReleaseRequest("10.244.0.1", B)], cooldown=0, now=NOW + 1)
    assert out.spec["unallocated"][-2:] == [0, 1]
    assert all(i is None for i in out.spec["allocations"]) and out.spec["attributes"] == []
    assert out.empty


def test_freed_ordinals_go_to_unallocated_in_calicos_order_cooled_first_then_released() -> None:
    """libcalico-go normalizes the block it reads (`blockFromBackend`: cooled ordinals to the tail, in
    ordinal order), then releases and normalizes again (the released ones): not one pass by ordinal."""
    spec = _block()["spec"]
    assert isinstance(spec, dict)
    parked = release(spec, [ReleaseRequest("10.244.0.1", B)], cooldown=60, now=NOW).spec
    free_before = list(parked["unallocated"])
    out = release(parked, [ReleaseRequest("10.244.0.0", A)], cooldown=0, now=NOW + 61)
    assert out.spec["unallocated"] == [*free_before, 1, 0]
    # With a cooldown: the cooled ordinal is freed on the read, the released one parked.
    parked = release(spec, [ReleaseRequest("10.244.0.1", B)], cooldown=60, now=NOW).spec
    out = release(parked, [ReleaseRequest("10.244.0.0", A)], cooldown=60, now=NOW + 61)
    assert out.spec["unallocated"] == [*free_before, 1]
    assert out.spec["attributes"][out.spec["allocations"][0]] == {"releasedAt": rfc3339(NOW + 61)}


def test_an_unreadable_released_at_never_ends_its_cooldown() -> None:
    spec = _block()["spec"]
    assert isinstance(spec, dict)
    parked = release(spec, [ReleaseRequest("10.244.0.0", A)], cooldown=60, now=NOW).spec
    parked["attributes"][parked["allocations"][0]]["releasedAt"] = "yesterday"
    assert released_at_seconds("yesterday") is None and released_at_seconds("2025-01-21T17:51:44") is None
    assert not normalize(parked, 0, NOW + 10_000)
    assert parked["allocations"][0] is not None


def test_a_cooldown_needs_now() -> None:
    spec = _block()["spec"]
    assert isinstance(spec, dict)
    with pytest.raises(ValueError):
        release(spec, [ReleaseRequest("10.244.0.0", A)], cooldown=60)


@pytest.mark.parametrize(
    ("spec", "cooldown", "problem"),
    [
        (None, 0, False),
        ({}, 0, False),
        ({"ipCooldownSeconds": 0}, 0, False),
        ({"ipCooldownSeconds": 300}, 300, False),
        ({"ipCooldownSeconds": 1200}, 1200, False),
        ({"ipCooldownSeconds": 1201}, MAX_COOLDOWN_SECONDS, True),
        ({"ipCooldownSeconds": -1}, MAX_COOLDOWN_SECONDS, True),
        ({"ipCooldownSeconds": "60"}, MAX_COOLDOWN_SECONDS, True),
        ({"ipCooldownSeconds": True}, MAX_COOLDOWN_SECONDS, True),
        ("nonsense", MAX_COOLDOWN_SECONDS, True),
    ],
)
def test_ipam_config_cooldown(spec: object, cooldown: int, problem: bool) -> None:
    raw = (
        {"metadata": {"name": "default"}} if spec is None else {"metadata": {"name": "default"}, "spec": spec}
    )
    config = parse_ipam_config(raw)
    assert config.ip_cooldown_seconds == cooldown
    assert (config.problem is not None) is problem


def test_the_watchers_record_knows_when_a_block_cools() -> None:
    obj = _block()
    obj["metadata"] = {**obj["metadata"], "resourceVersion": "7", "uid": "u"}  # type: ignore[dict-item]
    spec = obj["spec"]
    assert isinstance(spec, dict)
    plain = block_record(parse_block(obj))
    assert plain.cooling_since is None
    assert decode_block(encode_block(plain)) == plain
    obj["spec"] = release(spec, [ReleaseRequest("10.244.0.0", A)], cooldown=60, now=NOW).spec
    generic = block_record(parse_block(obj))
    fast = slim.block(orjson.dumps(obj))
    assert fast is not None
    assert slim.materialize(fast[0].record) == generic  # the fast path equals the generic one
    assert (
        fast[0].record.cooling_since == slim.lean_of(parse_block(obj)).cooling_since == generic.cooling_since
    )
    assert generic.cooling_since == float(int(NOW)) and generic.in_use == 2 and len(generic.slots) == 1
    assert decode_block(encode_block(generic)) == generic
    # Only a block that cools carries the seventh field: every other block's bytes are as before.
    assert encode_block(plain)[0] == 0x96 and encode_block(generic)[0] == 0x97
