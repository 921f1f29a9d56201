"""The watcher's lean block path (`producer/slim.py` → `producer/blockdiff.py`): attribute bytes compared,
decoded only where they changed.  It must mirror exactly what the generic path mirrors, and refuse a block
whose changed attribute is malformed as the generic path refuses it."""

from __future__ import annotations

import copy
import json
from typing import Any

import redis

from producer import slim
from producer.memory import refs
from producer.mirror import Mirror
from producer.relist import Kind
from shared.blockrecords import MirroredBlock, decode_block
from shared.clock import FakeClock
from shared.keys import STATE_GENERATION, Keys
from tests.fixtures.redis import Cluster, dirty_ids
from tests.producer.mirror_helpers import build, settle


def _fast(raw: dict[str, Any]) -> MirroredBlock:
    got = slim.block(json.dumps(raw).encode())
    assert got is not None
    return got[0]


def _raw_blocks(cluster: Cluster) -> list[dict[str, Any]]:
    cluster.blocks()  # stamps resourceVersions
    return [copy.deepcopy(raw) for raw in cluster.builder.ipam.blocks.values()]


def _state(client: redis.Redis, keys: Keys) -> dict[bytes, Any]:
    """Every mirrored key's content, blocks decoded (their encoding may differ in bytes, not in meaning)."""
    out: dict[bytes, Any] = {}
    for key in client.scan_iter(match=f"{keys.prefix}*".encode()):
        kind = client.type(key)
        if key == keys.blocks.encode():
            out[key] = {c: decode_block(v) for c, v in client.hgetall(key).items()}
        elif kind == b"hash":
            out[key] = client.hgetall(key)
            out[key].pop(STATE_GENERATION.encode(), None)  # how many pipelines wrote, not what
        elif kind == b"set":
            out[key] = client.smembers(key)
    return out


def test_the_fast_path_mirrors_what_the_generic_path_mirrors(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster
) -> None:
    build(cluster)
    mirror.relist(Kind.NODES, cluster.nodes())
    mirror.relist(Kind.PODS, cluster.pods())
    raws = _raw_blocks(cluster)
    mirror.relist(Kind.BLOCKS, cluster.blocks())
    generic = _state(client, keys)
    settle(client, keys)
    # The same blocks through the fast path: nothing changed, nothing dirtied, the same Redis content.
    assert mirror.apply_blocks([_fast(r) for r in raws]) == 0
    assert dirty_ids(client, keys) == set()
    assert _state(client, keys) == {k: v for k, v in generic.items() if b":dirty:" not in k}


def test_an_event_that_changes_nothing_but_bytes_dirties_nothing(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster
) -> None:
    """Attribute bytes that differ (key order, the CNI timestamp) but decode to the same slot."""
    build(cluster)
    raws = _raw_blocks(cluster)
    mirror.apply_blocks([_fast(r) for r in raws])
    settle(client, keys)
    for raw in raws:
        for attr in raw["spec"]["attributes"]:
            attr["secondary"] = dict(reversed(list(attr.get("secondary", {}).items())))
            attr["secondary"]["timestamp"] = "2026-12-01 00:00:00 +0000 UTC"
    assert mirror.apply_blocks([_fast(r) for r in raws]) == 0
    assert dirty_ids(client, keys) == set()


def test_a_changed_attribute_that_is_malformed_refuses_the_block(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster
) -> None:
    """As the generic path: the block is not mirrored (its allocations vanish, so none of them can be
    released on the strength of it) and the refusal is counted."""
    ids = build(cluster)
    raws = _raw_blocks(cluster)
    refused: list[int] = []
    mirror.on_malformed_block = lambda: refused.append(1)
    mirror.apply_blocks([_fast(r) for r in raws])
    web0 = ids["web-0"][0]
    (raw,) = [
        r for r in raws if any(a.get("secondary", {}).get("pod") == "web-0" for a in r["spec"]["attributes"])
    ]
    cidr = _fast(raw).cidr_str
    assert client.hexists(keys.blocks, cidr)
    settle(client, keys)
    for attr in raw["spec"]["attributes"]:
        if attr.get("secondary", {}).get("pod") == "web-0":
            attr["secondary"]["node"] = 7  # a number: parse_block refuses the whole block
    mirror.apply_blocks([_fast(raw)])
    assert refused == [1]
    assert not client.hexists(keys.blocks, cidr)
    assert web0 in dirty_ids(client, keys)  # vanished: re-validated, and found gone (kept)
    assert cidr not in mirror.memory.blocks


def test_the_watcher_keeps_prints_of_the_attributes_not_the_event_that_carried_them(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster
) -> None:
    """A held block refers to none of its event's bytes (msgspec's views would keep the whole event, or
    list page, alive), and a changed attribute is still told apart by its print: only its allocation is
    re-published and dirtied."""
    ids = build(cluster)
    raws = _raw_blocks(cluster)
    events = [_fast(r) for r in raws]
    mirror.apply_blocks(events)
    settle(client, keys)
    for event in events:
        held = mirror.memory.blocks[event.cidr_str].lean
        assert held.attrs is None and held.prints is not None
        assert held.prints == event.record.prints and held == event.record  # equal by prints
        assert len(held.prints) == len(event.record.attrs or ())
    web0 = ids["web-0"][0]
    (raw,) = [
        r for r in raws if any(a.get("secondary", {}).get("pod") == "web-0" for a in r["spec"]["attributes"])
    ]
    for attr in raw["spec"]["attributes"]:
        if attr.get("secondary", {}).get("pod") == "web-0":
            attr["secondary"]["pod"] = "web-0-renamed"
    assert mirror.apply_blocks([_fast(raw)]) >= 1
    assert dirty_ids(client, keys) == {web0}  # same handle and IP: the same id, with a new record
    records = [client.hget(keys.alloc(s), web0) for s in range(mirror.shards)]
    assert [r for r in records if r is not None and b"web-0-renamed" in r]


def test_the_pod_index_holds_where_each_slot_is_not_its_id_and_a_rebuilt_one_equals_it(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, clock: FakeClock
) -> None:
    """An allocation id (`<handle>/<ip>`, ~140 bytes) is not kept per indexed allocation: the index lists
    (block CIDR, ordinal, shard), the CIDR being the string that keys the held block, and the ids are
    derived from the held slots.  A watcher whose memory is rebuilt from Redis derives the same."""
    ids = build(cluster)
    mirror.relist(Kind.NODES, cluster.nodes())
    mirror.relist(Kind.PODS, cluster.pods())
    mirror.apply_blocks([_fast(r) for r in _raw_blocks(cluster)])
    mem = mirror.memory
    assert mem.pod_allocs
    for flat in mem.pod_allocs.values():
        for cidr, ordinal, shard in refs(flat):
            assert ordinal in mem.blocks[cidr].packed and isinstance(shard, int)
            assert next(c for c in mem.blocks if c == cidr) is cidr  # one string for both
    assert set(mirror.pod_allocations("default", "web-0")) == set(ids["web-0"])
    restarted = Mirror(client, keys, clock=clock)
    restarted.apply_blocks([])  # its first call loads its memory from Redis
    for pod in mem.pod_allocs:
        ns, name = pod.split("/", 1)
        assert restarted.pod_allocations(ns, name) == mirror.pod_allocations(ns, name)
    assert set(restarted.memory.pod_allocs) == set(mem.pod_allocs)


def test_a_held_block_keeps_its_slots_in_ordinal_order_as_they_come_and_go(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster
) -> None:
    """The block record is packed from the held slots as they stand when they are in ordinal order
    (`shared.blockrecords.in_ordinal_order`): an ordinal freed, then allocated again, must not leave them
    out of order (a dict puts a re-added key last)."""
    build(cluster)
    raws = _raw_blocks(cluster)
    mirror.apply_blocks([_fast(r) for r in raws])
    raw = max(raws, key=lambda r: sum(a is not None for a in r["spec"]["allocations"]))
    cidr = _fast(raw).cidr_str
    allocated = [o for o, a in enumerate(raw["spec"]["allocations"]) if a is not None]
    assert len(allocated) >= 2
    low = allocated[0]
    freed = copy.deepcopy(raw)
    spec = freed["spec"]
    spec["allocations"][low] = None
    spec["unallocated"] = sorted([*(spec.get("unallocated") or []), low])
    (spec.get("sequenceNumberForAllocation") or {}).pop(str(low), None)
    freed["metadata"]["resourceVersion"] = str(int(raw["metadata"]["resourceVersion"]) + 1)
    mirror.apply_blocks([_fast(freed)])
    packed = mirror.memory.blocks[cidr].packed
    assert low not in packed and list(packed) == sorted(packed)
    again = copy.deepcopy(raw)
    again["metadata"]["resourceVersion"] = str(int(raw["metadata"]["resourceVersion"]) + 2)
    mirror.apply_blocks([_fast(again)])
    packed = mirror.memory.blocks[cidr].packed
    assert low in packed and list(packed) == sorted(packed) == allocated
    assert decode_block(client.hget(keys.blocks, cidr) or b"").slots.keys() == set(allocated)
