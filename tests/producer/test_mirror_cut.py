"""A batch cut off part-way through its pipeline loses no change.

The watcher sends a batch's writes as one pipeline (`producer/writes.py`) and, when Redis fails under it,
drops its memory, reloads it from Redis and applies the batch again (`producer/sending.py`).  Redis runs
a pipeline's commands in order, so a cut leaves a prefix of them applied.  The order of the pipeline is
what makes every prefix safe: the dirty ids go before the block records the next diff is taken against,
so a prefix that holds a block's new record holds the dirty marks of what changed in it, and a prefix
that does not leaves the old record, against which the retried diff finds the change again.  Here every
prefix of one batch is tried: each leaves, after the retry, every changed allocation dirty and the mirror
as one whole apply leaves it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from producer.mirror import Mirror
from producer.relist import Kind
from redisio import luapipe
from shared.clock import FakeClock
from shared.keys import STATE_GENERATION, Keys
from tests.fixtures.redis import Cluster, dirty_ids
from tests.producer.mirror_helpers import build, settle

# Keys a retry may leave otherwise than one whole apply, by design: the dirty sets hold at least what one
# apply marks (a retry re-marks), the jobs' `queued` flags and the workers' `pulses` stream are wake-ups.
_WAKE_UPS = (":dirty:", ":queued:", ":pulses")


def _snapshot(client: redis.Redis) -> dict[bytes, bytes]:
    return {k: client.dump(k) for k in client.keys("*")}  # type: ignore[misc]


def _restore(client: redis.Redis, snapshot: dict[bytes, bytes]) -> None:
    client.flushall()
    for key, value in snapshot.items():
        client.restore(key, 0, value)


def _mirror_state(client: redis.Redis) -> dict[bytes, Any]:
    """Every key but the wake-ups, by value (sets and hashes as Python sets and dicts)."""
    out: dict[bytes, Any] = {}
    for key in sorted(client.keys("*")):  # type: ignore[arg-type]
        if any(w in key.decode() for w in _WAKE_UPS):
            continue
        kind = client.type(key)
        if kind == b"hash":
            out[key] = client.hgetall(key)
            # How many pipelines wrote (producer/generation.py), not what they wrote: a retried batch
            # sends one more.
            out[key].pop(STATE_GENERATION.encode(), None)
        elif kind == b"set":
            out[key] = client.smembers(key)
        elif kind == b"zset":
            out[key] = client.zrange(key, 0, -1, withscores=True)
        elif kind == b"string":
            out[key] = client.get(key)
        else:
            out[key] = kind
    return out


@pytest.fixture
def changed(client: redis.Redis, keys: Keys, clock: FakeClock, cluster: Cluster) -> Iterator[list[Any]]:
    """The cluster mirrored and validated (gate open, nothing dirty), then changed: a pod deleted with its
    CNI DEL, one deleted without, one added, one whose IPs changed.  Yields the changed blocks."""
    build(cluster)
    first = Mirror(client, keys, clock=clock)
    first.relist(Kind.NODES, cluster.nodes())
    first.relist(Kind.BLOCKS, cluster.blocks())
    first.relist(Kind.PODS, cluster.pods())
    first.mark_synced(True)
    settle(client, keys)
    b = cluster.builder
    b.delete_pod("default", "web-0")
    b.delete_pod("default", "db-0", cni_del=False)
    b.add_pod("default", "web-2", "node-1", dual_stack=True)
    b.add_pod("default", "db-1", "node-2")
    yield cluster.blocks()


def _apply(client: redis.Redis, keys: Keys, clock: FakeClock, blocks: list[Any]) -> Mirror:
    mirror = Mirror(client, keys, clock=clock)
    mirror.apply_blocks(blocks)
    return mirror


def test_every_prefix_of_a_cut_batch_is_completed_by_the_retry(
    monkeypatch: pytest.MonkeyPatch, client: redis.Redis, keys: Keys, clock: FakeClock, changed: list[Any]
) -> None:
    before = _snapshot(client)
    sent: list[int] = []
    real_run = luapipe.run

    def counting(pipe: redis.client.Pipeline, held: Any, raise_on_error: bool = True) -> list[Any]:
        sent.append(len(pipe.command_stack))
        return real_run(pipe, held, raise_on_error)

    monkeypatch.setattr(luapipe, "run", counting)
    _apply(client, keys, clock, changed)
    assert len(sent) == 1, sent  # one batch, one pipeline
    whole, whole_dirty = _mirror_state(client), dirty_ids(client, keys)
    assert whole_dirty, "the change dirtied nothing: the test would prove nothing"
    commands = sent[0]

    for cut in range(commands):
        _restore(client, before)

        def cut_off(pipe: redis.client.Pipeline, held: Any, raise_on_error: bool = True) -> list[Any]:
            del pipe.command_stack[cut:]  # noqa: B023 - run within this iteration
            if pipe.command_stack:
                real_run(pipe, held, False)
            raise redis.ConnectionError(f"cut after {cut} of {commands} commands")  # noqa: B023

        monkeypatch.setattr(luapipe, "run", cut_off)
        retried = Mirror(client, keys, clock=clock)
        with pytest.raises(redis.ConnectionError):
            retried.apply_blocks(changed)
        monkeypatch.setattr(luapipe, "run", real_run)
        retried.apply_blocks(changed)  # the publisher applies the batch again, on a memory reloaded
        assert dirty_ids(client, keys) >= whole_dirty, f"cut after {cut} of {commands} commands"
        assert _mirror_state(client) == whole, f"cut after {cut} of {commands} commands"
