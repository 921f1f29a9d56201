"""Lingering shard jobs (workers/linger.py): they serve new work after going idle, confirm due candidates
with no new event, look once per pulse (at the shards it names, every shard at the backstop), and end
after their idle time, budget or a stop request.  Time is fake: the job's `sleep` advances both the
monotonic clock and the wall clock, and runs the scripted actions that fall due (linger_helpers.py).
Adopting shards: test_linger_adopt.py."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import redis

from producer.mirror import Mirror
from shared.clock import FakeClock
from shared.keys import PULSES_MAXLEN, Keys, pulse_fields
from shared.shard import DEFAULT_SHARDS
from tests.fixtures.redis import Cluster, decisions
from tests.workers.shards.linger_helpers import GRACE, IDLE, POLL, Time, job, pulse_count, pulse_now, setup
from workers.shards import job_tuning, validate
from workers.shards import linger as lg
from workers.shards.job_tuning import JobTuning
from workers.shards.linger import Linger
from workers.shards.pulse import merge_named
from workers.shards.validate import validate_shard


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
