"""The handle index (`P:handles`, a ZSET) read as the older per-handle HASH was: field → node attribute;
and the node index (`P:nodeallocs:{s}`, a ZSET per shard) read as the older per-node SET was.

Tests assert on one handle's or node's entries; this reads them the way the leader and the workers do
(ZRANGE BYLEX over the prefix) and returns what HGETALL of `P:handle:<handle>` or SMEMBERS of
`P:nodeallocs:{s}:<node>` returned, so that their assertions read as they did.
"""

from __future__ import annotations

import redis

from shared.keys import Keys
from shared.records import (
    decode_handle_member,
    decode_node_member,
    encode_handle_member,
    encode_node_member,
    handle_member_range,
    node_member_range,
)


def handle_fields(client: redis.Redis, keys: Keys, handle: str) -> dict[bytes, bytes]:
    low, high = handle_member_range(handle)
    out: dict[bytes, bytes] = {}
    for member in client.zrange(keys.handles, low, high, bylex=True):
        assert isinstance(member, bytes)
        h, field, node = decode_handle_member(member)
        assert h == handle
        out[field.encode()] = node.encode()
    return out


def add_handle_field(client: redis.Redis, keys: Keys, handle: str, field: str, node: str) -> None:
    client.zadd(keys.handles, {encode_handle_member(handle, field, node): 0})


def remove_handle_field(client: redis.Redis, keys: Keys, handle: str, field: str, node: str) -> int:
    """Members removed (1 when the entry was there)."""
    return int(client.zrem(keys.handles, encode_handle_member(handle, field, node)))


def node_alloc_ids(client: redis.Redis, keys: Keys, shard: int, node: str) -> set[str]:
    low, high = node_member_range(node)
    out: set[str] = set()
    for member in client.zrange(keys.nodeallocs(shard), low, high, bylex=True):
        assert isinstance(member, bytes)
        owner, alloc_id = decode_node_member(member)
        assert owner == node
        out.add(alloc_id)
    return out


def add_node_alloc(client: redis.Redis, keys: Keys, shard: int, node: str, alloc_id: str) -> None:
    client.zadd(keys.nodeallocs(shard), {encode_node_member(node, alloc_id): 0})
