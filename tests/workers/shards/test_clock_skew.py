"""One clock for every host: a worker whose host clock runs ahead cannot shorten a grace period.

Workers (and the leader) read Redis's `TIME` every 10 s and carry it forward on the monotonic clock
(`shared.clock.ServerClock`) unless a test hands them a clock.  Here no clock is handed over: the
worker's host clock is skewed by patching `time.time` in this process (the Redis server's clock, in its
own process, is not).
"""

from __future__ import annotations

import time

import pytest
import redis

from producer.mirror import Mirror
from shared.clock import ServerClock, SystemClock
from shared.keys import Keys
from shared.shard import DEFAULT_SHARDS, shard_of
from tests.fixtures.redis import Cluster, decisions
from tests.workers.shards.validate_helpers import GRACE, candidate, start
from workers.shards.validate import validate_shard

SKEW = 2 * GRACE  # the second worker's host clock runs this far ahead


def _run(client: redis.Redis, keys: Keys, clock: SystemClock | None = None) -> int:
    """A job on every shard with the production clock (or `clock`); returns the confirmed count."""
    jobs = [validate_shard(s, client=client, keys=keys, clock=clock) for s in range(DEFAULT_SHARDS)]
    return sum(j.confirmed for j in jobs)


def test_server_clock_reads_redis_time(client: redis.Redis) -> None:
    seconds, micros = client.time()
    assert ServerClock(client).now() == pytest.approx(seconds + micros / 1e6, abs=5.0)


def test_a_worker_whose_host_clock_runs_ahead_does_not_shorten_the_grace_period(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster.builder.add_node("node-1")
    handle, [ip, *_] = cluster.builder.add_pod("default", "web-0", "node-1")
    start(mirror, cluster)
    assert _run(client, keys) == 0
    cluster.builder.delete_pod("default", "web-0", cni_del=False)
    mirror.delete_pod("default", "web-0")
    leaked = f"{handle}/{ip}"
    assert _run(client, keys) == 0  # worker A, on a host whose clock is right: the timer starts
    started = candidate(client, keys, "node-1", leaked)
    assert started is not None

    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + SKEW)  # worker B's host: far ahead
    dirty = keys.dirty(shard_of("node-1"))
    client.sadd(dirty, leaked)  # an event brings the allocation back to a worker
    assert _run(client, keys) == 0  # on Redis's clock: still well inside its grace period
    assert decisions(client, keys) == []
    assert candidate(client, keys, "node-1", leaked) == started

    # What the host clock would have done: confirmed at once, the grace period shortened by the skew.
    client.sadd(dirty, leaked)
    assert _run(client, keys, SystemClock()) == 1
