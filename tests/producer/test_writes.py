"""`producer.writes`: a batch's writes land whole, in commands hiredis packs in linear time."""

from __future__ import annotations

import redis

from producer.redis_scripts import ProducerScripts
from producer.writes import HSET_CHUNK_BYTES, Writes, _hset_parts
from shared.keys import Keys


def _calls(client: redis.Redis, command: str) -> int:
    entry = client.info("commandstats").get(f"cmdstat_{command}")
    return int(entry["calls"]) if isinstance(entry, dict) else 0


def test_a_large_hset_is_cut_into_bounded_commands_in_order() -> None:
    mapping: dict[str, bytes | str] = {f"f{i:03d}": bytes([i % 256]) * 8000 for i in range(50)}
    parts = _hset_parts(mapping)
    assert len(parts) > 1
    assert all(sum(len(k) + len(v) for k, v in p.items()) <= HSET_CHUNK_BYTES for p in parts)
    assert [k for p in parts for k in p] == list(mapping)  # every field once, in the order gathered
    assert {k: v for p in parts for k, v in p.items()} == mapping


def test_a_field_larger_than_the_bound_goes_alone() -> None:
    big = b"x" * (HSET_CHUNK_BYTES + 1)
    assert _hset_parts({"a": b"1", "big": big, "c": b"3"}) == [{"a": b"1"}, {"big": big}, {"c": b"3"}]
    assert _hset_parts({}) == []


def test_a_batch_of_large_records_lands_whole(client: redis.Redis, keys: Keys) -> None:
    writes = Writes(keys, ProducerScripts.register(client))
    records = {f"10.0.{i}.0/26": bytes([i % 256]) * 8000 for i in range(60)}  # ~480 KB of block bases
    for cidr, value in records.items():
        writes.base_set(keys.blocks, cidr, value)
    writes.hset(keys.alloc(0), "small", b"1")
    before = _calls(client, "hset")
    writes.execute(client, 1000)
    assert client.hgetall(keys.blocks) == {k.encode(): v for k, v in records.items()}
    assert client.hget(keys.alloc(0), "small") == b"1"
    sent = _calls(client, "hset") - before
    assert 1 + 480_000 // HSET_CHUNK_BYTES <= sent <= 2 + 480_000 // HSET_CHUNK_BYTES + 1
