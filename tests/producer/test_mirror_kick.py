"""The mirror arms the shard queues: a kick enqueues the shards with due candidates or expired leases, a
failed enqueue drops its queued flag, and no shard is armed while the gate is shut."""

from __future__ import annotations

import pytest
import redis

from producer.mirror import Mirror
from shared.clock import FakeClock
from shared.keys import Keys
from shared.shard import DEFAULT_SHARDS, shard_of
from tests.fixtures.redis import Cluster, dirty_ids
from tests.producer.mirror_helpers import build, load, settle


def test_kick_enqueues_shards_with_due_candidates_or_expired_leases(
    client: redis.Redis, keys: Keys, mirror: Mirror, clock: FakeClock, enqueued: list[int]
) -> None:
    client.zadd(keys.due(1), {"h/10.0.0.1": clock.now() + 10})
    client.zadd(keys.inflight(2), {"h/10.0.0.2": clock.now() - 1})
    assert mirror.kick() == [2]
    clock.advance(3)
    assert mirror.kick() == []  # 2 is queued, its lease expired only 4 s ago; 1 is not due yet
    clock.advance(8)
    # 1 is due; 2's job still holds a lease expired 12 s ago: its worker died, the shard is re-armed.
    assert mirror.kick() == [1, 2]
    assert enqueued == [2, 1, 2]


def test_failed_enqueue_drops_the_queued_flag(client: redis.Redis, keys: Keys, cluster: Cluster) -> None:
    def broken(shard: int) -> None:
        raise ConnectionError("queue down")

    mirror = Mirror(client, keys, enqueue=broken)
    build(cluster)
    with pytest.raises(ConnectionError):
        mirror.apply_blocks(cluster.blocks())
    assert all(not client.exists(keys.queued(s)) for s in range(DEFAULT_SHARDS))
    assert dirty_ids(client, keys)  # the work itself is not lost: the next event or kick enqueues it


def test_no_shard_is_armed_while_the_gate_the_mirror_wrote_is_shut(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, enqueued: list[int]
) -> None:
    """While listing (not synced) or while the datastore is not ready, a batch only adds dirty ids: a
    job would find the gate shut.  Opening the gate kicks every shard with work."""
    ids = build(cluster)
    mirror.set_config(300.0, True)
    mirror.mark_synced(False)
    load(mirror, cluster)
    shards = {shard_of("node-1"), shard_of("node-2")}
    assert enqueued == [] and mirror.kick() == []
    assert not any(client.exists(keys.queued(s)) for s in range(DEFAULT_SHARDS))
    assert not client.exists(keys.pulses)
    assert set(ids["web-0"]) <= dirty_ids(client, keys)
    mirror.mark_synced(True)
    assert sorted(enqueued) == sorted(shards)
    settle(client, keys)
    enqueued.clear()
    mirror.set_config(300.0, False)
    cluster.builder.delete_pod("default", "web-0", cni_del=False)
    mirror.delete_pod("default", "web-0")
    assert enqueued == [] and mirror.kick() == []
    assert set(ids["web-0"]) <= dirty_ids(client, keys)
    mirror.set_config(300.0, True)
    assert shard_of("node-1") in enqueued
