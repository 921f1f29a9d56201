"""What the shard job's tests share (`test_validate*.py`, the lingering and clock-skew tests, the mirror's
KubeVirt tests): the mirror started on a `ClusterBuilder` cluster, a job run on every shard, and the
candidate and due time of one allocation."""

from __future__ import annotations

import dataclasses

import redis

from producer.mirror import Mirror
from producer.relist import Kind
from shared.clock import FakeClock
from shared.gcrecords import Candidate, decode_candidate
from shared.keys import Keys
from shared.shard import DEFAULT_SHARDS, shard_of
from tests.fixtures.redis import Cluster
from workers.shards.validate import ShardStats, validate_shard

GRACE = 900.0


def start(mirror: Mirror, cluster: Cluster, grace: float | None = GRACE, ready: bool = True) -> None:
    mirror.set_config(grace, ready)
    mirror.relist(Kind.NODES, cluster.nodes())
    mirror.relist(Kind.PODS, cluster.pods())
    mirror.relist(Kind.BLOCKS, cluster.blocks())
    mirror.mark_synced()


def run(client: redis.Redis, keys: Keys, clock: FakeClock, requeued: list[int] | None = None) -> ShardStats:
    """Run a job on every shard, as the workers would; returns the summed counters."""
    total = ShardStats(shard=-1)
    for s in range(DEFAULT_SHARDS):
        stats = validate_shard(s, client=client, keys=keys, clock=clock, enqueue=(requeued or []).append)
        for f in dataclasses.fields(ShardStats):
            value = getattr(stats, f.name)
            if f.name != "shard" and isinstance(value, int) and not isinstance(value, bool):
                setattr(total, f.name, getattr(total, f.name) + value)
        total.gated |= stats.gated
    return total


def candidate(client: redis.Redis, keys: Keys, node: str, alloc_id: str) -> Candidate | None:
    raw = client.hget(keys.cand(shard_of(node)), alloc_id)
    return None if raw is None else decode_candidate(raw)


def due(client: redis.Redis, keys: Keys, node: str, alloc_id: str) -> float | None:
    return client.zscore(keys.due(shard_of(node)), alloc_id)
