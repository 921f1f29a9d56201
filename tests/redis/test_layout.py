"""A Redis written by an older layout (1: a HASH per handle, a pulse counter, a SET per node; 2: a SET per
node) is migrated when a watcher starts: the handle and node indexes are filled from the stored blocks, the
old keys are deleted, the layout recorded; and a Redis already on this layout is left alone."""

from __future__ import annotations

import redis

from producer.mirror import Mirror
from shared import keys as k
from shared.clock import FakeClock
from shared.keys import Keys
from shared.records import decode_handle_member, decode_node_member
from shared.shard import DEFAULT_SHARDS
from tests.redis.conftest import Cluster
from tests.redis.test_mirror import build, load


def test_an_older_layout_is_migrated_once(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, clock: FakeClock
) -> None:
    build(cluster)
    assert mirror.migrate_layout() == 0  # an empty Redis: nothing to move, the layout recorded
    assert client.hget(keys.state, k.STATE_LAYOUT) == k.LAYOUT.encode()
    load(mirror, cluster)
    index = client.zrange(keys.handles, 0, -1)
    assert len(index) >= 6
    by_node = {s: client.zrange(keys.nodeallocs(s), 0, -1) for s in range(DEFAULT_SHARDS)}
    assert sum(map(len, by_node.values())) >= 5  # the LoadBalancer IP has no node
    # What layout 1 left: one HASH per handle and one SET per node, no `P:handles`, no `layout`.
    for member in index:
        handle, field, node = decode_handle_member(member)
        client.hset(keys.old_handle(handle), field, node)
    old_sets = set()
    for s, members in by_node.items():
        for member in members:
            node, alloc_id = decode_node_member(member)
            client.sadd(keys.old_nodeallocs(s, node), alloc_id)
            old_sets.add(keys.old_nodeallocs(s, node))
        client.delete(keys.nodeallocs(s))
    handles = {decode_handle_member(m)[0] for m in index}
    client.delete(keys.handles)
    client.hdel(keys.state, k.STATE_LAYOUT)
    client.set(keys.old_pulse, "7")  # the older pulse, a counter

    restarted = Mirror(client, keys, clock=clock)  # a new watcher: its memory loads from Redis
    assert restarted.migrate_layout() == len(index)
    assert client.zrange(keys.handles, 0, -1) == index
    assert {s: client.zrange(keys.nodeallocs(s), 0, -1) for s in range(DEFAULT_SHARDS)} == by_node
    assert not any(client.exists(keys.old_handle(h)) for h in handles)
    assert not any(client.exists(key) for key in old_sets)
    assert not client.exists(keys.old_pulse)
    assert client.hget(keys.state, k.STATE_LAYOUT) == k.LAYOUT.encode()
    assert Mirror(client, keys, clock=clock).migrate_layout() == 0


def test_layout_2_gets_its_node_index_migrated(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, clock: FakeClock
) -> None:
    """Layout 2 kept the handle index as now, and a SET per node: only the node index moves."""
    build(cluster)
    mirror.migrate_layout()
    load(mirror, cluster)
    index = client.zrange(keys.handles, 0, -1)
    by_node = {s: client.zrange(keys.nodeallocs(s), 0, -1) for s in range(DEFAULT_SHARDS)}
    for s, members in by_node.items():
        for member in members:
            node, alloc_id = decode_node_member(member)
            client.sadd(keys.old_nodeallocs(s, node), alloc_id)
        client.delete(keys.nodeallocs(s))
    client.hset(keys.state, k.STATE_LAYOUT, "2")
    assert Mirror(client, keys, clock=clock).migrate_layout() == len(index)
    assert client.zrange(keys.handles, 0, -1) == index
    assert {s: client.zrange(keys.nodeallocs(s), 0, -1) for s in range(DEFAULT_SHARDS)} == by_node
    assert not client.keys(keys.old_nodeallocs(0, "*").replace("{0}", "{*}"))
    assert client.hget(keys.state, k.STATE_LAYOUT) == b"3"
