"""Lingering shard jobs adopt free shards up to a fair share (all of them when lightly loaded, taken from
later jobs; given back past the share when busy), never touch a shard another live job holds otherwise,
and adopt nothing while gated.  Time is fake (linger_helpers.py)."""

from __future__ import annotations

import pytest
import redis

from producer.mirror import Mirror
from shared.clock import FakeClock
from shared.keys import QUEUED_TTL_SECONDS, Keys
from shared.shard import DEFAULT_SHARDS
from tests.fixtures.redis import Cluster
from tests.workers.shards.linger_helpers import LEASE, Time, held, job, pulse_now, setup
from workers.shards import linger as lg
from workers.shards.job_tuning import LIVE_WORKERS_TTL_SECONDS, CachedCount


def test_a_lingering_job_adopts_a_free_shard_and_one_whose_job_is_waiting(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, clock: FakeClock
) -> None:
    s, _ = setup(mirror, cluster)
    free, waiting = [x for x in range(DEFAULT_SHARDS) if x != s][:2]
    client.set(keys.queued(waiting), "1", px=300_000)  # armed by the watcher; its job waits in a queue
    client.sadd(keys.dirty(waiting), "h/10.1.1.1")
    t = Time(clock)
    during: list[set[int]] = []
    t.at(1.0, lambda: during.append(held(client, keys, "j:a")))
    t.at(2.0, lambda: client.sadd(keys.dirty(free), "h/10.2.2.2") and pulse_now(client, keys))
    stats = job(client, keys, clock, t, s, served=(s, free, waiting), token="j:a")
    assert during == [{s, free, waiting}]
    assert stats.adopted == 2
    assert stats.vanished == 2  # both adopted shards' ids were taken (they name no allocation)
    assert not any(client.exists(keys.queued(x)) for x in (s, free, waiting))


def test_a_shard_taken_by_another_job_meanwhile_is_replaced_by_the_next_free_one(
    client: redis.Redis,
    keys: Keys,
    mirror: Mirror,
    cluster: Cluster,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two jobs that start together see the same free shards; the one that loses a shard to the other
    takes the next free one at once.  It used to try only its share's first pick and wait for the next
    adoption look, leaving a shard armed (its job waiting behind two lingering ones) for ~2.5 s at the
    end of every 10k cold start where it happened."""
    s, _ = setup(mirror, cluster)
    first, second = [x for x in range(DEFAULT_SHARDS) if x != s][:2]
    for x in (first, second):
        client.set(keys.queued(x), "1", px=300_000)  # armed by the watcher; their jobs wait in a queue
        client.sadd(keys.dirty(x), f"h/10.5.5.{x}")
    real = lg.Lingerer._adopt

    def racing(self: lg.Lingerer[object], m: float, flags: list[tuple[int, object, object]]) -> bool:
        if any(x == first for x, _, _ in flags):  # another job holds it between the read and the take
            client.set(keys.queued(first), "j:other", px=int(LEASE * 1000))
        return real(self, m, flags)

    monkeypatch.setattr(lg.Lingerer, "_adopt", racing)
    t = Time(clock)
    during: list[set[int]] = []
    t.at(1.0, lambda: during.append(held(client, keys, "j:a")))
    stats = job(
        client,
        keys,
        clock,
        t,
        s,
        served=(s, first, second),
        workers=lambda: 2,
        token="j:a",
        concentrate=False,
    )
    assert during == [{s, second}]
    assert stats.adopted == 1
    assert client.get(keys.queued(first)) == b"j:other"


def test_a_lingering_job_never_adopts_a_shard_another_live_job_holds(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, clock: FakeClock
) -> None:
    s, _ = setup(mirror, cluster)
    other, old_style = [x for x in range(DEFAULT_SHARDS) if x != s][:2]
    client.set(keys.queued(other), "j:other", px=int(LEASE * 1000))
    client.set(keys.queued(old_style), "1", px=int(LEASE * 1000))  # a running job without a token
    for x in (other, old_style):
        client.sadd(keys.dirty(x), "h/10.3.3.3")
    t = Time(clock)
    stats = job(client, keys, clock, t, s, served=(s, other, old_style), token="j:a", concentrate=False)
    assert stats.adopted == 0
    assert client.get(keys.queued(other)) == b"j:other"
    assert client.get(keys.queued(old_style)) == b"1"
    assert all(client.sismember(keys.dirty(x), "h/10.3.3.3") for x in (other, old_style))


def test_two_lingering_jobs_split_the_shards_half_and_half(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, clock: FakeClock
) -> None:
    s, _ = setup(mirror, cluster)
    every = tuple(range(DEFAULT_SHARDS))
    seen: dict[str, set[int]] = {}

    def job_b() -> None:  # the other worker's job starts while the first lingers
        seen["a"] = held(client, keys, "j:a")
        tb = Time(FakeClock(clock.now()))
        tb.at(1.0, lambda: seen.update(b=held(client, keys, "j:b"), a_after=held(client, keys, "j:a")))
        target = next(x for x in every if x not in seen["a"])
        client.set(keys.queued(target), "1", px=300_000)  # armed by the watcher for B's job
        job(
            client,
            keys,
            tb.clock,
            tb,
            target,
            served=every,
            workers=lambda: 2,
            token="j:b",
            concentrate=False,
        )

    t = Time(clock)
    t.at(3.0, job_b)
    job(client, keys, clock, t, s, served=every, workers=lambda: 2, token="j:a", concentrate=False)
    half = DEFAULT_SHARDS // 2
    assert len(seen["a"]) == half and s in seen["a"]
    assert len(seen["b"]) == half
    assert seen["a"] & seen["b"] == set()
    assert seen["a_after"] == seen["a"]  # the second job took none of the first's shards


def test_a_gated_job_adopts_nothing(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, clock: FakeClock
) -> None:
    """Before the mirror has synced a job releases what it holds at once: had it adopted the shards of
    waiting jobs, each would be armed again by the next batch while its old job still waits."""
    s, _ = setup(mirror, cluster)
    client.hset(keys.state, "synced", "0")
    waiting = next(x for x in range(DEFAULT_SHARDS) if x != s)
    client.set(keys.queued(waiting), "1", px=300_000)
    t = Time(clock)
    stats = job(client, keys, clock, t, s, served=(s, waiting), token="j:a")
    assert stats.gated and stats.adopted == 0 and not stats.requeued
    assert client.get(keys.queued(waiting)) == b"1"
    assert not client.exists(keys.queued(s))


def test_a_gated_job_takes_nothing(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, clock: FakeClock
) -> None:
    """A job that finds the gate shut leaves the dirty ids where they are: it used to take a batch and
    hand it back id by id (three times per allocation over a 150k cold start's listing)."""
    s, alloc_id = setup(mirror, cluster)
    client.hset(keys.state, "synced", "0")
    dirty_before = client.smembers(keys.dirty(s))
    assert alloc_id.encode() in dirty_before
    t = Time(clock)
    stats = job(client, keys, clock, t, s, token="j:a")
    assert stats.gated and stats.validated == 0
    assert client.smembers(keys.dirty(s)) == dirty_before
    assert client.zcard(keys.inflight(s)) == 0
    assert not client.exists(keys.queued(s))
    assert stats.looks == 0


def test_past_its_share_a_lingering_job_adopts_a_shard_whose_job_has_waited(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, clock: FakeClock
) -> None:
    """Every worker lingering on its share starves a shard whose job waits in the queue (seen in a long
    chaos run: a SIGKILLed worker's registration still counted, so 4 "live" workers for 4 shards and 3
    jobs each lingering on one).  Past its share a job takes one shard whose job has waited
    `WAITING_ADOPT_SECONDS`, not one just armed."""
    s, _ = setup(mirror, cluster)
    waited, fresh = [x for x in range(DEFAULT_SHARDS) if x != s][:2]
    ttl_ms = int(QUEUED_TTL_SECONDS * 1000)
    # Armed 3 s ago (the watcher's SET with the queued TTL), and 0.1 s ago: both jobs still in the queue.
    client.set(keys.queued(waited), "1", px=ttl_ms - 3000)
    client.set(keys.queued(fresh), "1", px=ttl_ms - 100)
    for x in (waited, fresh):
        client.sadd(keys.dirty(x), f"h/10.4.4.{x}")
    t = Time(clock)
    during: list[set[int]] = []
    t.at(1.0, lambda: during.append(held(client, keys, "j:a")))
    every = tuple(range(DEFAULT_SHARDS))
    stats = job(
        client,
        keys,
        clock,
        t,
        s,
        served=every,
        workers=lambda: DEFAULT_SHARDS,
        token="j:a",
        concentrate=False,
    )
    assert during == [{s, waited}]
    assert stats.adopted == 1
    assert not client.sismember(keys.dirty(waited), f"h/10.4.4.{waited}")  # taken and judged
    assert client.get(keys.queued(fresh)) == b"1"  # left to its own job
    assert client.sismember(keys.dirty(fresh), f"h/10.4.4.{fresh}")


def test_the_live_worker_count_is_asked_at_most_once_per_ttl() -> None:
    """The fair share's count of live workers (two Redis commands) is cached for a lingering job."""
    now = [0.0]
    asked: list[float] = []

    def count() -> int:
        asked.append(now[0])
        return len(asked)

    cached = CachedCount(count, LIVE_WORKERS_TTL_SECONDS, lambda: now[0])
    assert cached() == 1
    now[0] = LIVE_WORKERS_TTL_SECONDS - 0.1
    assert cached() == 1
    now[0] = LIVE_WORKERS_TTL_SECONDS
    assert cached() == 2
    assert asked == [0.0, LIVE_WORKERS_TTL_SECONDS]


def _step_as(client: redis.Redis, keys: Keys, shard: int, token: str) -> int:
    """What another job's next renewing look at `shard` answers: 1 held by it, 0 held by another."""
    from redisio.shardqueue.lua import LEASE_LUA, STEP

    sk = keys.shard(shard)
    reply = client.register_script(LEASE_LUA + STEP)(
        keys=[sk.queued, sk.dirty, sk.inflight, sk.due],
        args=[token, int(LEASE * 1000), repr(0.0), repr(LEASE), 0, "1", "0", "0"],
    )
    return int(reply[0])


def test_a_light_job_gathers_the_shards_of_a_later_job_and_the_later_one_lets_go(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, clock: FakeClock
) -> None:
    """At light load one job serves every shard (one wake per pulse instead of one per worker): a job
    busy under `light_below` takes the shards of a lingering job whose token sorts after its own, and
    that job finds them held at its next renewal."""
    s, _ = setup(mirror, cluster)
    later = next(x for x in range(DEFAULT_SHARDS) if x != s)
    client.set(keys.queued(later), "j:b", px=int(LEASE * 1000))  # another worker's lingering job
    t = Time(clock)
    during: list[set[int]] = []
    for i in range(1, 8):
        t.at(
            float(i), lambda i=i: client.sadd(keys.dirty(later), f"h/10.4.4.{i}") and pulse_now(client, keys)
        )
    t.at(1.5, lambda: during.append(held(client, keys, "j:a")))  # not judged light on its first look
    t.at(6.5, lambda: during.append(held(client, keys, "j:a")))
    t.at(6.6, lambda: during.append({_step_as(client, keys, later, "j:b")}))
    stats = job(client, keys, clock, t, s, served=(s, later), workers=lambda: 2, token="j:a", budget=7.5)
    assert during == [{s}, {s, later}, {0}]
    assert (stats.adopted, stats.taken_over, stats.given_back) == (1, 1, 0)
    assert stats.vanished >= 1  # the gathered shard's ids were taken and judged


def test_a_light_job_never_takes_from_an_earlier_job_nor_a_running_job_without_a_token(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, clock: FakeClock
) -> None:
    s, _ = setup(mirror, cluster)
    earlier, old_style = [x for x in range(DEFAULT_SHARDS) if x != s][:2]
    client.set(keys.queued(earlier), "j:0", px=int(LEASE * 1000))  # sorts before "j:a"
    client.set(keys.queued(old_style), "1", px=int(LEASE * 1000))
    t = Time(clock)
    for i in range(1, 8):
        t.at(float(i), lambda: pulse_now(client, keys))
    stats = job(client, keys, clock, t, s, served=(s, earlier, old_style), token="j:a", budget=7.5)
    assert (stats.adopted, stats.taken_over) == (0, 0)
    assert client.get(keys.queued(earlier)) == b"j:0"
    assert client.get(keys.queued(old_style)) == b"1"


def test_a_busy_job_gives_back_the_shards_past_its_share(
    client: redis.Redis,
    keys: Keys,
    mirror: Mirror,
    cluster: Cluster,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job holding every shard (it was alone) whose looks take most of its time, once a second worker
    is live, lets go of the shards past its fair share: re-armed and enqueued where ids remain, so that
    the other worker's job takes them."""
    s, _ = setup(mirror, cluster)
    every = tuple(range(DEFAULT_SHARDS))
    t = Time(clock)
    real = lg.Lingerer._look

    def slow(self: lg.Lingerer[object], now: float, m: float, adopt: bool) -> tuple[bool, bool, bool]:
        out = real(self, now, m, adopt)
        t.m += 0.9  # each look takes 0.9 s: busy ~90 % with a pulse a second
        return out

    monkeypatch.setattr(lg.Lingerer, "_look", slow)
    live = [1]
    for i in range(1, 12):
        t.at(float(i), lambda: pulse_now(client, keys))
    t.at(3.0, lambda: live.__setitem__(0, 2))  # a second worker comes up

    def fill() -> None:  # ids left on every shard
        for x in every:
            client.sadd(keys.dirty(x), f"h/10.6.6.{x}")

    t.at(3.0, fill)
    during: list[tuple[set[int], dict[int, bytes | None]]] = []
    t.at(
        9.5,
        lambda: during.append((held(client, keys, "j:a"), {x: client.get(keys.queued(x)) for x in every})),
    )
    requeued: list[int] = []
    stats = job(
        client, keys, clock, t, s, served=every, workers=lambda: live[0], token="j:a",
        enqueue=requeued.append, budget=20.0,
    )  # fmt: skip
    half = DEFAULT_SHARDS // 2
    assert stats.adopted == DEFAULT_SHARDS - 1  # alone, its share was every shard
    assert stats.given_back == DEFAULT_SHARDS - half
    assert stats.taken_over == 0  # busy: never light
    kept, flags = during[0]
    assert len(kept) == half and s in kept
    for x in set(every) - kept:  # given back: re-armed and enqueued where ids remained, else free
        assert (flags[x], x in requeued) in ((b"1", True), (None, False))
