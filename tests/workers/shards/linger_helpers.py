"""What the lingering shard jobs' tests (`test_linger*.py`) share: fake time whose `sleep` advances both
clocks and runs the scripted actions that fall due, a pulse stream on that time, and one job run on it."""

from __future__ import annotations

from collections.abc import Callable

import redis

from producer.mirror import Mirror
from shared.clock import FakeClock
from shared.keys import PULSES_MAXLEN, Keys
from shared.shard import DEFAULT_SHARDS, shard_of
from tests.fixtures.redis import Cluster
from tests.workers.shards.validate_helpers import start
from workers.shards import linger as lg
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
