"""Lingering shard jobs (workers/linger.py): they serve new work after going idle, confirm due candidates
with no new event, end after their idle time, budget or a stop request, adopt free shards up to a fair
share (all of them when lightly loaded, taken from later jobs; given back past the share when busy), and
never touch a shard another live job holds otherwise.  Time is fake: the job's `sleep` advances both
the monotonic clock and the wall clock, and runs the scripted actions that fall due."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
import redis

from producer.mirror import Mirror
from shared.clock import FakeClock
from shared.keys import PULSES_MAXLEN, QUEUED_TTL_SECONDS, Keys, pulse_fields
from shared.shard import DEFAULT_SHARDS, shard_of
from tests.fixtures.redis import Cluster, decisions
from tests.workers.shards.test_validate import start
from workers.shards import job_tuning, validate
from workers.shards import linger as lg
from workers.shards.job_tuning import LIVE_WORKERS_TTL_SECONDS, CachedCount, JobTuning
from workers.shards.linger import Linger
from workers.shards.pulse import merge_named
from workers.shards.validate import ShardStats, validate_shard

GRACE = 5.0
LEASE = 60.0
IDLE = 10.0
POLL = 0.3


class Time:
    """Fake monotonic time; `sleep` advances it (and the wall clock) and runs actions that fell due."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.m = 0.0
        self.actions: list[tuple[float, Callable[[], None]]] = []
        self.sleeps = 0

    def at(self, t: float, action: Callable[[], None]) -> None:
        self.actions.append((t, action))
        self.actions.sort(key=lambda a: a[0])

    def monotonic(self) -> float:
        return self.m

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.m += seconds
        self.clock.advance(seconds)
        while self.actions and self.actions[0][0] <= self.m:
            _, action = self.actions.pop(0)
            action()


class FakePulse:
    """`workers.linger.StreamPulse` on fake time: it reads `P:pulses` without blocking, then sleeps (on
    the test's clock, running what falls due) in steps of `POLL` until a pulse arrived or the timeout."""

    def __init__(self, client: redis.Redis, keys: Keys, time: Time) -> None:
        self.real = lg.StreamPulse(client, keys)
        self.time = time
        self.client, self.key = client, keys.pulses
        self.taken = self.real.newest()

    def take_named(self) -> frozenset[int] | None:
        """What the real one gathers from its XREADs: the shards the pulses since the last call named."""
        entries = self.client.xrange(self.key, min=b"(" + self.taken)
        if entries:
            self.taken = entries[-1][0]
        named = merge_named(set(), entries, capped=len(entries) >= PULSES_MAXLEN)
        return None if named is None else frozenset(named)

    def newest(self) -> bytes:
        return self.real.newest()

    def wait(self, since: bytes, timeout: float) -> bytes:
        end = self.time.m + timeout
        while True:
            seen = self.real.newest()
            if seen != since or self.time.m >= end:
                return seen
            self.time.sleep(min(POLL, end - self.time.m))


def pulse_now(client: redis.Redis, keys: Keys) -> bool:
    """What the watcher appends per batch that made work."""
    return bool(client.xadd(keys.pulses, {"b": b"1"}))


def pulse_count(client: redis.Redis, keys: Keys) -> int:
    return int(client.xlen(keys.pulses))


def job(
    client: redis.Redis,
    keys: Keys,
    clock: FakeClock,
    time: Time,
    shard: int,
    *,
    enqueue: Callable[[int], None] | None = None,
    budget: float = 30.0,
    per_node: bool = False,
    batch_size: int = 1000,
    **linger: object,
) -> ShardStats:
    options: dict[str, object] = {"idle": IDLE, "poll": POLL, "served": (shard,)} | linger
    return validate_shard(
        shard,
        client=client,
        keys=keys,
        clock=clock,
        enqueue=enqueue,
        lease=LEASE,
        batch_size=batch_size,
        budget=budget,
        monotonic=time.monotonic,
        pulse=FakePulse(client, keys, time),
        per_node=per_node,
        linger=Linger(**options),  # type: ignore[arg-type]
    )


def held(client: redis.Redis, keys: Keys, token: str) -> set[int]:
    return {s for s in range(DEFAULT_SHARDS) if client.get(keys.queued(s)) == token.encode()}


def setup(mirror: Mirror, cluster: Cluster) -> tuple[int, str]:
    """One node with one pod (shard `s`); returns (s, the pod IP's alloc id)."""
    cluster.builder.add_node("node-1")
    handle, ips = cluster.builder.add_pod("default", "web-0", "node-1")
    start(mirror, cluster, grace=GRACE)
    return shard_of("node-1"), f"{handle}/{ips[0]}"


def test_a_lingering_job_picks_up_ids_dirtied_after_it_went_idle(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, clock: FakeClock, enqueued: list[int]
) -> None:
    s, leaked = setup(mirror, cluster)
    t = Time(clock)
    pulses: list[int] = []

    def leak() -> None:
        cluster.builder.delete_pod("default", "web-0", cni_del=False)
        enqueued.clear()
        before = pulse_count(client, keys)
        mirror.delete_pod("default", "web-0")
        pulses.append(pulse_count(client, keys) - before)
        assert enqueued == []  # the shard is held: the watcher enqueues no job for it

    t.at(3.0, leak)
    stats = job(client, keys, clock, t, s, token="j:a")
    assert pulses == [1]  # the batch that made work appended a pulse
    # Two allocations (pod, tunnel) at start, the leaked one after the pulse (a candidate), and again
    # when its grace period ended (GRACE < IDLE: the job was still there).
    assert (stats.validated, stats.candidates, stats.confirmed) == (4, 1, 1)
    assert client.hexists(keys.cand(s), leaked)
    assert stats.polls > 0 and not stats.held_elsewhere
    assert not client.exists(keys.queued(s))  # released when it ended


def test_a_lingering_job_confirms_a_candidate_when_its_due_time_passes(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, clock: FakeClock
) -> None:
    s, leaked = setup(mirror, cluster)
    cluster.builder.delete_pod("default", "web-0", cni_del=False)
    mirror.delete_pod("default", "web-0")
    t = Time(clock)
    pulse = pulse_count(client, keys)
    stats = job(client, keys, clock, t, s)
    assert pulse_count(client, keys) == pulse  # no event after the job started
    assert (stats.candidates, stats.promoted, stats.confirmed, stats.decisions) == (1, 1, 1, 1)
    assert [d.alloc_id for d in decisions(client, keys)] == [leaked]
    # It looked at the due time it had learnt, not only at the backstop: within a poll of the grace end.
    assert clock.now() - decisions(client, keys)[0].first_seen <= GRACE + IDLE + 2 * POLL


def test_a_lingering_job_ends_after_its_idle_time(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, clock: FakeClock
) -> None:
    s, _ = setup(mirror, cluster)
    t = Time(clock)
    stats = job(client, keys, clock, t, s)
    assert IDLE <= t.m <= IDLE + POLL + 1e-9
    assert stats.validated == 2 and not stats.requeued
    # Idle: one wait for a pulse per poll, a look only at the backstop / reap / renew cadence.
    assert stats.polls >= 0.7 * IDLE / POLL
    assert stats.looks <= 1 + IDLE / Linger().backstop + 1
    assert not client.exists(keys.queued(s))


def test_an_idle_job_of_ipamgc_work_waits_for_pulses_a_second_at_a_time(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, clock: FakeClock
) -> None:
    """`ipamgc work` runs its jobs with `JobTuning`'s defaults, whose poll is `Linger`'s documented one
    (it was 0.3 s there: ~3.5 XREADs a second per waiting job instead of ~1)."""
    assert JobTuning().poll == Linger().poll == 1.0
    s, _ = setup(mirror, cluster)
    t = Time(clock)
    stats = job(client, keys, clock, t, s, poll=JobTuning().poll)
    assert IDLE <= t.m <= IDLE + JobTuning().poll + 1e-9
    assert stats.polls <= IDLE / JobTuning().poll + 2


def test_a_busy_lingering_job_looks_once_per_pulse(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, clock: FakeClock
) -> None:
    """Woken by a pulse every second, a job renews its flag and reaps in those looks: none is made for
    the chores alone (it made one every backstop period besides)."""
    s, _ = setup(mirror, cluster)
    t = Time(clock)
    pulses = 8
    for i in range(1, pulses + 1):
        t.at(float(i), lambda i=i: client.sadd(keys.dirty(s), f"h/10.7.7.{i}") and pulse_now(client, keys))
    stats = job(client, keys, clock, t, s, budget=pulses + 0.5, token="j:a")
    assert stats.vanished == pulses  # every pulse's id was taken and judged
    assert stats.looks <= 1 + pulses  # the first look, then one per pulse
    assert client.zcard(keys.inflight(s)) == 0


def test_a_lingering_job_ends_after_its_budget_and_rearms_the_work_left(
    client: redis.Redis,
    keys: Keys,
    mirror: Mirror,
    cluster: Cluster,
    clock: FakeClock,
) -> None:
    s, _ = setup(mirror, cluster)
    t = Time(clock)
    for i in range(1, 60):  # an event every second, for longer than the budget
        t.at(float(i), lambda: client.sadd(keys.dirty(s), "h/10.9.9.9") and pulse_now(client, keys))
    requeued: list[int] = []
    stats = job(client, keys, clock, t, s, budget=5.0, enqueue=requeued.append)
    assert 5.0 <= t.m <= 5.0 + POLL + 1e-9
    # The last event came after the last look: its id is left dirty, the flag re-armed, a job enqueued.
    assert client.sismember(keys.dirty(s), "h/10.9.9.9")
    assert (stats.requeued, requeued, client.get(keys.queued(s))) == (True, [s], b"1")


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


def test_one_look_validates_at_most_a_batch_whatever_the_shards_it_holds(
    client: redis.Redis,
    keys: Keys,
    mirror: Mirror,
    cluster: Cluster,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A relist fills every shard at once: a job holding them all still takes `batch_size` ids a look in
    all (its memory is bounded by the batch, not by the shards it gathered), and takes every id."""
    s, _ = setup(mirror, cluster)
    every = tuple(range(DEFAULT_SHARDS))
    for x in every:
        client.sadd(keys.dirty(x), *[f"h{x}/10.{x}.0.{i}" for i in range(90)])
    per_look: list[int] = []
    real = validate.validate_batches

    def counting(batches: Sequence[Any], state: Any, now: float) -> list[float | None]:
        per_look.append(sum(len(lease.ids) for _, lease in batches))
        return real(batches, state, now)

    monkeypatch.setattr(validate, "validate_batches", counting)
    for x in every:
        if x != s:
            client.set(keys.queued(x), "1", px=300_000)  # armed: their jobs wait in a queue
    t = Time(clock)
    stats = job(client, keys, clock, t, s, served=every, token="j:a", batch_size=50)
    assert stats.vanished == 90 * DEFAULT_SHARDS  # every id taken (they name no allocation)
    assert max(per_look) <= 50 and len(per_look) >= 90 * DEFAULT_SHARDS // 50
    assert sum(per_look) >= 90 * DEFAULT_SHARDS


def test_a_look_steps_the_shards_the_pulses_name_and_every_shard_at_the_backstop(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, clock: FakeClock
) -> None:
    """A pulse names the shards its batch made work in: the job takes that work at once and leaves the
    shards it did not name (an empty step each) for its backstop look, `look_every` later."""
    s, _ = setup(mirror, cluster)
    every = tuple(range(DEFAULT_SHARDS))
    named, unnamed = [x for x in every if x != s][:2]
    t = Time(clock)
    seen: dict[str, tuple[bool, bool]] = {}

    def work() -> None:
        client.sadd(keys.dirty(unnamed), "h/10.9.9.9")  # no pulse names it (as after a reaped lease)
        client.sadd(keys.dirty(named), "h/10.8.8.8")
        client.xadd(keys.pulses, pulse_fields([named]), maxlen=PULSES_MAXLEN)  # type: ignore[arg-type]

    def snapshot(at: str) -> None:
        seen[at] = (
            bool(client.sismember(keys.dirty(named), "h/10.8.8.8")),
            bool(client.sismember(keys.dirty(unnamed), "h/10.9.9.9")),
        )

    t.at(1.0, work)
    t.at(1.7, lambda: snapshot("after the pulse"))
    t.at(1.0 + lg.Linger().backstop + 1.0, lambda: snapshot("after the backstop"))
    stats = job(client, keys, clock, t, s, served=every, token="j:a")
    assert seen["after the pulse"] == (False, True)  # the named shard's id taken, the other left
    assert seen["after the backstop"] == (False, False)  # every held shard stepped at the backstop
    assert stats.vanished == 2


def test_the_watchers_pulse_names_the_shards_its_batch_made_work_in(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster
) -> None:
    s, _ = setup(mirror, cluster)
    cluster.builder.delete_pod("default", "web-0", cni_del=False)
    mirror.delete_pod("default", "web-0")
    entries = client.xrevrange(keys.pulses, count=1)
    assert merge_named(set(), entries, capped=False) == {s}


def test_a_second_job_for_a_held_shard_exits_at_once_without_touching_its_flag(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, clock: FakeClock
) -> None:
    s, _ = setup(mirror, cluster)
    client.set(keys.queued(s), "j:other", px=5000)
    t = Time(clock)
    requeued: list[int] = []
    stats = job(client, keys, clock, t, s, token="j:a", enqueue=requeued.append)
    assert stats.held_elsewhere and stats.validated == 0 and t.m == 0.0
    assert client.get(keys.queued(s)) == b"j:other"
    assert 0 < client.pttl(keys.queued(s)) <= 5000
    assert client.scard(keys.dirty(s)) == 2 and requeued == []


def test_a_stop_request_ends_a_lingering_job_within_a_poll_and_releases_its_flags(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, clock: FakeClock
) -> None:
    s, _ = setup(mirror, cluster)
    quiet = next(x for x in range(DEFAULT_SHARDS) if x != s)
    stopped_at: list[float] = []
    t = Time(clock)

    def stop() -> None:
        client.sadd(keys.dirty(s), "h/10.4.4.4")  # work that arrived but was not taken yet
        stopped_at.append(t.m)
        job_tuning.request_stop()

    t.at(2.0, stop)
    requeued: list[int] = []
    job_tuning.clear_stop()
    try:
        job(client, keys, clock, t, s, served=(s, quiet), token="j:a", enqueue=requeued.append)
    finally:
        assert job_tuning.stop_requested()
        job_tuning.clear_stop()
    assert t.m - stopped_at[0] <= POLL + 1e-9
    assert requeued == [s] and client.get(keys.queued(s)) == b"1"  # re-armed: another worker takes over
    assert not client.exists(keys.queued(quiet))  # no work left there: simply released


def test_per_node_writes_no_due_times_and_promotes_none(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, clock: FakeClock
) -> None:
    s, leaked = setup(mirror, cluster)
    cluster.builder.delete_pod("default", "web-0", cni_del=False)
    mirror.delete_pod("default", "web-0")
    stats = validate_shard(s, client=client, keys=keys, clock=clock, per_node=True)
    assert stats.candidates == 1 and client.hexists(keys.cand(s), leaked)
    assert client.zcard(keys.due(s)) == 0
    client.zadd(keys.due(s), {leaked: clock.now()})  # e.g. written before: still never promoted
    clock.advance(GRACE + 1)
    client.set(keys.queued(s), "1", px=300_000)  # a job armed for the shard (kick would, for the due id)
    t = Time(clock)
    stats = job(client, keys, clock, t, s, per_node=True)
    assert (stats.promoted, stats.confirmed) == (0, 0)
    assert client.zscore(keys.due(s), leaked) is not None


def test_a_job_whose_flag_is_gone_exits_at_once(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, clock: FakeClock
) -> None:
    """A job that waited while a lingering job adopted its shard and then released it (re-arming only
    when ids remained) has nothing to do: it must not linger in turn."""
    s, _ = setup(mirror, cluster)
    client.delete(keys.queued(s))
    t = Time(clock)
    stats = job(client, keys, clock, t, s)
    assert (stats.validated, stats.held_elsewhere, t.m) == (0, False, 0.0)
    assert not client.exists(keys.queued(s))


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
