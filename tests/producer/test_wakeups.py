"""The watcher kicks when a due time comes, not on a poll: the kick says when the next one is due, and a due
time a worker or the leader writes later reaches the watcher through `P:wakeups` (a blocking BZPOPMIN)."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from producer.mirror import Mirror
from producer.wakeups import KickSchedule, Wakeups
from shared.clock import FakeClock
from shared.keys import Keys
from tests.polling import wait_until
from workers.common import wakeups


def test_a_kick_says_when_the_next_candidate_is_due(
    client: redis.Redis, keys: Keys, mirror: Mirror, clock: FakeClock
) -> None:
    now = clock.now()
    client.zadd(keys.due(1), {"h/10.0.0.1": now + 10, "h/10.0.0.3": now + 25})
    client.zadd(keys.due(3), {"h/10.0.0.4": now + 7})
    mirror.kick()
    assert mirror.arming.next_kick == pytest.approx(now + 7)
    clock.advance(8)
    assert mirror.kick() == [3]  # due now: armed, and the next is shard 1's, two seconds ahead
    assert mirror.arming.next_kick == pytest.approx(now + 10)


def test_a_kick_with_nothing_ahead_has_no_next_time_but_a_live_lease_is_watched(
    client: redis.Redis, keys: Keys, mirror: Mirror, clock: FakeClock
) -> None:
    mirror.kick()
    assert mirror.arming.next_kick is None  # the watcher then waits for its ceiling or a wakeup
    client.zadd(keys.inflight(2), {"h/10.0.0.2": clock.now() + 60})  # a running job's lease
    client.set(keys.queued(2), "1", px=600_000)
    mirror.kick()
    assert mirror.arming.next_kick == pytest.approx(clock.now() + 65)  # when it would count as dead (+5 s)


def test_the_schedule_keeps_an_offer_made_while_a_kick_ran() -> None:
    now = [100.0]
    woken: list[int] = []
    schedule = KickSchedule(30.0, lambda: woken.append(1), lambda: now[0])
    assert schedule.left() == 30.0
    schedule.offer(105.0)
    assert schedule.left() == 5.0 and woken == [1]
    schedule.offer(120.0)  # later than the next kick: nothing changes, no wake-up
    assert schedule.left() == 5.0 and woken == [1]
    schedule.kicking()
    schedule.offer(110.0)  # arrives after the kick read the shards: it must survive the kick's own answer
    schedule.kicked(20.0)
    assert schedule.at == 110.0
    schedule.kicking()
    schedule.kicked(None)  # nothing ahead: the ceiling
    assert schedule.at == 130.0


def test_a_due_time_written_by_a_worker_moves_the_watchers_kick(client: redis.Redis, keys: Keys) -> None:
    woken = threading.Event()
    schedule = KickSchedule(3600.0, woken.set, time.monotonic)
    stop = threading.Event()
    thread = threading.Thread(
        target=Wakeups(client, keys, schedule, time.time, stop).run, daemon=True, name="wakeups"
    )
    thread.start()
    try:
        pipe = client.pipeline(transaction=False)
        wakeups.offer(pipe, keys, [time.time() + 40, time.time() + 20])
        pipe.execute()
        wait_until(woken.is_set, what="the wakeup to reach the schedule")
        assert 15 < schedule.left() <= 20  # the earliest of the two
        assert client.zcard(keys.wakeups) == 0  # taken
    finally:
        stop.set()


def test_writers_keep_only_the_earliest_wakeup(client: redis.Redis, keys: Keys) -> None:
    for due in (50.0, 30.0, 40.0):
        wakeups.offer(client, keys, [due])
    assert client.zrange(keys.wakeups, 0, -1, withscores=True) == [(b"30.0", 30.0)]
    wakeups.offer(client, keys, [])
    assert client.zcard(keys.wakeups) == 1
