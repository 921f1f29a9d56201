"""The shard work queue: take-and-lease, ack, reaper, due promotion, finish; driven by a fake clock."""

from __future__ import annotations

import pytest
import redis

from redisio.shardqueue import lua as q
from redisio.shardqueue.queue import ShardQueue
from shared.clock import FakeClock
from shared.keys import Keys

SHARD = 7


@pytest.fixture
def sq(client: redis.Redis, keys: Keys) -> ShardQueue:
    return ShardQueue(client, keys, SHARD)


def members(client: redis.Redis, key: str) -> set[str]:
    return {m.decode() for m in client.smembers(key)}


def inflight(client: redis.Redis, key: str) -> dict[str, float]:
    return {m.decode(): s for m, s in client.zrange(key, 0, -1, withscores=True)}


def test_take_leases_up_to_n_ids(client: redis.Redis, keys: Keys, sq: ShardQueue, clock: FakeClock) -> None:
    client.sadd(keys.dirty(SHARD), *[f"h/10.0.0.{i}" for i in range(5)])
    lease = sq.take(clock.now(), 60.0, 3)
    assert len(lease.ids) == 3
    assert lease.deadline == clock.now() + 60.0
    assert inflight(client, keys.inflight(SHARD)) == dict.fromkeys(lease.ids, clock.now() + 60.0)
    assert len(members(client, keys.dirty(SHARD))) == 2
    assert sq.take(clock.now(), 60.0, 1000).ids.__len__() == 2
    assert sq.take(clock.now(), 60.0, 1000).ids == ()


def test_take_handles_batches_larger_than_one_lua_call(
    client: redis.Redis, keys: Keys, sq: ShardQueue, clock: FakeClock
) -> None:
    client.sadd(keys.dirty(SHARD), *[f"h/{i}" for i in range(2500)])
    lease = sq.take(clock.now(), 60.0, 2500)
    assert len(lease.ids) == 2500
    assert client.zcard(keys.inflight(SHARD)) == 2500


def test_ack_finishes_the_lease(client: redis.Redis, keys: Keys, sq: ShardQueue, clock: FakeClock) -> None:
    client.sadd(keys.dirty(SHARD), "h/10.0.0.1", "h/10.0.0.2")
    lease = sq.take(clock.now(), 60.0, 10)
    assert sq.ack(lease) == 2
    assert client.zcard(keys.inflight(SHARD)) == 0


def test_an_id_dirtied_while_in_flight_is_not_lost(
    client: redis.Redis, keys: Keys, sq: ShardQueue, clock: FakeClock
) -> None:
    client.sadd(keys.dirty(SHARD), "h/10.0.0.1")
    lease = sq.take(clock.now(), 60.0, 10)
    client.sadd(keys.dirty(SHARD), "h/10.0.0.1")  # a new event while it is being validated
    sq.ack(lease)
    assert members(client, keys.dirty(SHARD)) == {"h/10.0.0.1"}


def test_a_batch_never_acked_returns_to_dirty_after_its_lease(
    client: redis.Redis, keys: Keys, sq: ShardQueue, clock: FakeClock
) -> None:
    client.sadd(keys.dirty(SHARD), "h/10.0.0.1", "h/10.0.0.2")
    sq.take(clock.now(), 60.0, 10)  # the worker dies here
    assert sq.reap(clock.now()) == 0
    clock.advance(59.9)
    assert sq.reap(clock.now()) == 0
    clock.advance(0.1)
    assert sq.reap(clock.now()) == 2
    assert members(client, keys.dirty(SHARD)) == {"h/10.0.0.1", "h/10.0.0.2"}
    assert client.zcard(keys.inflight(SHARD)) == 0


def test_a_stale_ack_does_not_drop_another_jobs_lease(
    client: redis.Redis, keys: Keys, sq: ShardQueue, clock: FakeClock
) -> None:
    client.sadd(keys.dirty(SHARD), "h/10.0.0.1")
    slow = sq.take(clock.now(), 60.0, 10)
    clock.advance(61)
    sq.reap(clock.now())
    fresh = sq.take(clock.now(), 60.0, 10)
    assert fresh.ids == slow.ids
    assert sq.ack(slow) == 0  # the slow job finishing late must not end the new lease
    assert client.zcard(keys.inflight(SHARD)) == 1
    assert sq.ack(fresh) == 1


def test_nack_returns_the_lease_to_dirty(
    client: redis.Redis, keys: Keys, sq: ShardQueue, clock: FakeClock
) -> None:
    client.sadd(keys.dirty(SHARD), "h/10.0.0.1")
    lease = sq.take(clock.now(), 60.0, 10)
    assert sq.nack(lease) == 1
    assert members(client, keys.dirty(SHARD)) == {"h/10.0.0.1"}
    assert client.zcard(keys.inflight(SHARD)) == 0


def test_promote_moves_only_due_candidates(
    client: redis.Redis, keys: Keys, sq: ShardQueue, clock: FakeClock
) -> None:
    now = clock.now()
    client.zadd(keys.due(SHARD), {"h/10.0.0.1": now - 1, "h/10.0.0.2": now, "h/10.0.0.3": now + 1})
    assert sq.promote(now) == 2
    assert members(client, keys.dirty(SHARD)) == {"h/10.0.0.1", "h/10.0.0.2"}
    assert [m.decode() for m in client.zrange(keys.due(SHARD), 0, -1)] == ["h/10.0.0.3"]


def test_finish_clears_the_flag_and_rearms_only_when_work_remains(
    client: redis.Redis, keys: Keys, sq: ShardQueue
) -> None:
    client.set(keys.queued(SHARD), b"1")
    assert sq.finish(rearm=True) is False
    assert not client.exists(keys.queued(SHARD))
    client.set(keys.queued(SHARD), b"1")
    client.sadd(keys.dirty(SHARD), "h/10.0.0.1")
    assert sq.finish(rearm=True) is True
    assert client.exists(keys.queued(SHARD))
    assert 0 < client.pttl(keys.queued(SHARD)) <= 300_000
    assert sq.finish(rearm=False) is False  # a gated job: the producer kicks the shard when ready
    assert not client.exists(keys.queued(SHARD))


@pytest.mark.parametrize("script", [q.TAKE, q.ACK, q.NACK, q.REFILL, q.REAP, q.PROMOTE, q.FINISH])
def test_every_script_documents_its_keys_and_args(script: str) -> None:
    header = [line for line in script.strip().splitlines() if line.startswith("--")]
    assert any("KEYS[1]" in line for line in header)
    assert any("ARGV" in line for line in header)
    assert "TIME" not in script  # time always comes in ARGV
