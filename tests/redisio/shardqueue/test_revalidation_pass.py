"""A pass over every allocation of a shard (`P:revalidate:{s}`): the workers move its ids into dirty a batch
at a time, and a shard with a pass pending has work for every step that asks.

A watcher that starts on a Redis not marked synced writes no dirty id for what its first list finds and
sets the pass instead (`producer/statehash.py`), so Redis never holds every allocation's id twice.  What
the workers rely on: every allocation of the shard comes through dirty once the pass is done, whatever the
batch size; a job that read an older pass cannot move a newer one; a wrong value re-validates, never
skips; the job's end, a lingering job's release and the watcher's kick all count the pass as work.
"""

from __future__ import annotations

import pytest
import redis

from redisio import luapipe
from redisio.shardqueue.queue import ShardFlags, ShardQueue
from shared.clock import FakeClock
from shared.keys import Keys

SHARD = 3


@pytest.fixture
def sq(client: redis.Redis, keys: Keys) -> ShardQueue:
    return ShardQueue(client, keys, SHARD)


def _allocations(client: redis.Redis, keys: Keys, n: int) -> set[bytes]:
    ids = {f"k8s-pod-network.{i:064x}/10.0.{i // 250}.{i % 250}".encode() for i in range(n)}
    client.hset(keys.alloc(SHARD), mapping=dict.fromkeys(ids, b"record"))
    return ids


def _drain(sq: ShardQueue, clock: FakeClock, batch: int) -> tuple[list[bytes], int]:
    """As a draining job does: take, and refill when nothing is dirty; returns every id taken, refills."""
    taken: list[bytes] = []
    refills = 0
    for _ in range(10_000):
        lease = sq.take(clock.now(), 60.0, batch)
        if lease.ids:
            taken += [i.encode() for i in lease.ids]
            sq.ack(lease)
            continue
        if not sq.refill(batch):
            return taken, refills
        refills += 1
    raise AssertionError("the pass never ended")


@pytest.mark.parametrize("batch", [1, 7, 1000])
def test_a_pass_brings_every_allocation_through_dirty_then_ends(
    client: redis.Redis, keys: Keys, sq: ShardQueue, clock: FakeClock, batch: int
) -> None:
    ids = _allocations(client, keys, 600)
    client.set(keys.revalidate(SHARD), "p1:0")
    taken, refills = _drain(sq, clock, batch)
    assert set(taken) == ids
    assert client.exists(keys.revalidate(SHARD)) == 0
    assert refills >= min(600 // batch, 8)  # a batch at a time, not the shard at once
    if batch < 600:
        # dirty never held the shard whole: each refill adds about a batch (HSCAN's COUNT is a hint)
        assert len(taken) <= len(ids) + batch * 2


def test_dirty_holds_about_a_batch_of_the_pass_at_a_time(
    client: redis.Redis, keys: Keys, sq: ShardQueue
) -> None:
    _allocations(client, keys, 2000)
    client.set(keys.revalidate(SHARD), "p1:0")
    assert sq.refill(100)
    assert 0 < client.scard(keys.dirty(SHARD)) <= 400
    assert client.get(keys.revalidate(SHARD)) not in (None, b"p1:0")  # the cursor moved on


def test_a_job_that_read_an_older_pass_moves_nothing(client: redis.Redis, keys: Keys, sq: ShardQueue) -> None:
    _allocations(client, keys, 300)
    client.set(keys.revalidate(SHARD), "p2:0")  # a new pass since the job read "p1:0"
    assert sq.refill(50, b"p1:0")  # another job moved it: there may be more, look again
    assert client.scard(keys.dirty(SHARD)) == 0
    assert client.get(keys.revalidate(SHARD)) == b"p2:0"


def test_an_unreadable_pass_starts_again(
    client: redis.Redis, keys: Keys, sq: ShardQueue, clock: FakeClock
) -> None:
    ids = _allocations(client, keys, 50)
    client.set(keys.revalidate(SHARD), "not a cursor")
    taken, _ = _drain(sq, clock, 20)
    assert set(taken) == ids  # re-validates the whole shard: more, never less
    assert client.exists(keys.revalidate(SHARD)) == 0


def test_no_pass_no_refill(client: redis.Redis, keys: Keys, sq: ShardQueue) -> None:
    _allocations(client, keys, 10)
    assert not sq.refill(100)
    assert client.scard(keys.dirty(SHARD)) == 0


def test_a_pending_pass_is_work_for_finish_release_and_kick(
    client: redis.Redis, keys: Keys, sq: ShardQueue, clock: FakeClock
) -> None:
    _allocations(client, keys, 10)
    client.set(keys.revalidate(SHARD), "p1:0")
    client.set(keys.queued(SHARD), "1")
    assert sq.finish(rearm=True)  # the job ends with the pass pending: re-armed, enqueue another
    assert client.get(keys.queued(SHARD)) == b"1"

    flags = ShardFlags(client, keys)
    client.set(keys.queued(SHARD), "j:token")
    assert flags.release(SHARD, "j:token", 60_000, rearm=True)

    client.delete(keys.queued(SHARD))
    pipe = client.pipeline(transaction=False)
    flags.kick_in(pipe, SHARD, repr(clock.now()), 60_000, 60_000)
    (armed, _next) = luapipe.execute(pipe, client, [flags.kick_script])[0]
    assert int(armed) == 1  # nothing dirty, due or leased: the pass alone arms a job

    client.delete(keys.revalidate(SHARD), keys.queued(SHARD))
    pipe = client.pipeline(transaction=False)
    flags.kick_in(pipe, SHARD, repr(clock.now()), 60_000, 60_000)
    assert int(luapipe.execute(pipe, client, [flags.kick_script])[0][0]) == 0
