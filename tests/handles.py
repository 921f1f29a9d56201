"""The handle index (`P:handles`, a ZSET) read as the older per-handle HASH was: field → node attribute.

Tests assert on one handle's entries; this reads them the way the leader does (ZRANGE BYLEX over the
handle's prefix) and returns what HGETALL of `P:handle:<handle>` returned, so that their assertions read
as they did.
"""

from __future__ import annotations

import redis

from shared.gcrecords import decode_handle_member, encode_handle_member, handle_member_range
from shared.keys import Keys


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
