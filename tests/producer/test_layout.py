"""A Redis written by the older layout (a HASH per handle, a pulse counter) is migrated when a watcher
starts: the handle index is filled from the stored blocks, the old keys are deleted, the layout recorded;
and a Redis already on this layout is left alone."""

from __future__ import annotations

import redis

from producer.mirror import Mirror
from shared import keys as k
from shared.clock import FakeClock
from shared.gcrecords import decode_handle_member
from shared.keys import Keys
from tests.fixtures.redis import Cluster
from tests.producer.mirror_helpers import build, load


def test_an_older_layout_is_migrated_once(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, clock: FakeClock
) -> None:
    build(cluster)
    assert mirror.migrate_layout() == 0  # an empty Redis: nothing to move, the layout recorded
    assert client.hget(keys.state, k.STATE_LAYOUT) == k.LAYOUT.encode()
    load(mirror, cluster)
    index = client.zrange(keys.handles, 0, -1)
    assert len(index) >= 6
    # What the older layout left: one HASH per handle, no `P:handles`, no `layout`.
    for member in index:
        handle, field, node = decode_handle_member(member)
        client.hset(keys.old_handle(handle), field, node)
    handles = {decode_handle_member(m)[0] for m in index}
    client.delete(keys.handles)
    client.hdel(keys.state, k.STATE_LAYOUT)
    client.set(keys.old_pulse, "7")  # the older pulse, a counter

    restarted = Mirror(client, keys, clock=clock)  # a new watcher: its memory loads from Redis
    assert restarted.migrate_layout() == len(index)
    assert client.zrange(keys.handles, 0, -1) == index
    assert not any(client.exists(keys.old_handle(h)) for h in handles)
    assert not client.exists(keys.old_pulse)
    assert client.hget(keys.state, k.STATE_LAYOUT) == k.LAYOUT.encode()
    assert Mirror(client, keys, clock=clock).migrate_layout() == 0
