"""The shard job's time budget (a job out of it requeues its shard) and its batches across several shards
(shared round trips, the decisions of one job per shard)."""

from __future__ import annotations

import pytest
import redis

from producer.mirror import Mirror
from shared.clock import FakeClock
from shared.keys import Keys
from shared.shard import shard_of
from tests.fixtures.redis import Cluster, decisions
from tests.workers.shards.validate_helpers import GRACE, run, start
from workers.common.redis_state import read_state
from workers.shards.batches import validate_batches
from workers.shards.validate import _ShardJob, validate_shard


def test_a_job_out_of_time_budget_requeues_its_shard(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, clock: FakeClock
) -> None:
    cluster.builder.add_node("node-1")
    cluster.builder.add_pod("default", "web-0", "node-1")
    start(mirror, cluster)
    s = shard_of("node-1")
    requeued: list[int] = []
    stats = validate_shard(
        s, client=client, keys=keys, clock=clock, enqueue=requeued.append, batch_size=1, budget=0
    )
    assert (stats.batches, stats.requeued, requeued) == (1, True, [s])
    assert client.exists(keys.queued(s))
    stats = validate_shard(s, client=client, keys=keys, clock=clock, enqueue=requeued.append)
    assert (stats.validated, stats.requeued) == (1, False)
    assert not client.exists(keys.queued(s))


def test_batches_of_several_shards_share_their_round_trips_and_decide_as_one_by_one(
    client: redis.Redis,
    keys: Keys,
    mirror: Mirror,
    cluster: Cluster,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A lingering job holding several shards validates what it took from all of them with one pipeline
    of reads, one of the nodes and pods they name, and one of writes (`validate_batches`); its
    decisions and timers are those of one job per shard."""
    nodes = [f"node-{i}" for i in range(12)]
    by_shard: dict[int, str] = {}
    for n in nodes:
        by_shard.setdefault(shard_of(n), n)
    assert len(by_shard) >= 2, "the nodes span at least two shards"
    leaked: list[str] = []
    for s, node in sorted(by_shard.items()):
        cluster.builder.add_node(node)
        handle, ips = cluster.builder.add_pod("default", f"gone-{s}", node)
        cluster.builder.add_pod("default", f"kept-{s}", node)
        leaked.append(f"{handle}/{ips[0]}")
    start(mirror, cluster)
    run(client, keys, clock)
    for s in sorted(by_shard):
        cluster.builder.delete_pod("default", f"gone-{s}", cni_del=False)
        mirror.delete_pod("default", f"gone-{s}")
    assert run(client, keys, clock).candidates == len(by_shard)
    clock.advance(GRACE + 1)
    for s in sorted(by_shard):  # their grace has ended: every gone pod's IP is dirty again
        client.sadd(keys.dirty(s), *[i for i in leaked if shard_of(by_shard[s]) == s])

    executed: list[int] = []
    real = redis.client.Pipeline.execute

    def counting(self: redis.client.Pipeline, raise_on_error: bool = True) -> list[object]:
        executed.append(len(self.command_stack))
        return real(self, raise_on_error)

    monkeypatch.setattr(redis.client.Pipeline, "execute", counting)
    jobs = [_ShardJob(s, client, keys, clock, 1000, 60.0) for s in sorted(by_shard)]
    leases = [job.queue.take(clock.now(), 60.0, 1000) for job in jobs]
    assert all(lease.ids for lease in leases)
    state = read_state(client, keys)
    executed.clear()
    dues = validate_batches(list(zip(jobs, leases, strict=True)), state, clock.now())
    monkeypatch.setattr(redis.client.Pipeline, "execute", real)
    # the batches' records, the nodes and pods they name, every batch's writes (the confirmed leaks'
    # block resourceVersions are one HMGET of their own, not a pipeline)
    assert len(executed) == 3, executed
    assert dues == [None] * len(jobs)
    got = sorted(d.alloc_id for d in decisions(client, keys))
    assert got == sorted(leaked)
    assert all(client.zcard(keys.inflight(s)) == 0 for s in by_shard)
