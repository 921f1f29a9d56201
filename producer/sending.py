"""Sending the mirror's writes: one pipeline per batch of events, and the shards it armed to the queue.

Why a module: the per-kind apply paths (`producer/mirror.py`) only add to a `Writes` (`producer/writes.py`);
when and how those writes reach Redis is decided here.  Inside `batch()` every apply and delete call
shares one `Writes`, sent once at the end: a batch of watch events of several kinds is one round trip,
one command per key.  A send that fails on Redis may have been half applied, so the watcher's memory is
dropped (rebuilt from Redis before the next call) and the error propagates: the caller applies the batch
again, and every write is idempotent.  The shards a send newly armed get their jobs (`producer/arming.py`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import redis

from producer.arming import MirrorStats, ShardArming
from producer.generation import Generation
from producer.memory import Memory
from producer.redis_scripts import ProducerScripts
from producer.writes import Writes
from redisio.heldconn import HeldConnection
from shared.keys import Keys


class BatchSender:
    """`writes()` for an apply path, `send(writes)` after it, `batch()` around several of them."""

    def __init__(
        self,
        redis_client: redis.Redis,
        keys: Keys,
        scripts: ProducerScripts,
        memory: Memory,
        stats: MirrorStats,
        arming: ShardArming,
        queued_ttl: float,
        held: HeldConnection | None = None,
        generation: Generation | None = None,
    ) -> None:
        self.redis = redis_client
        self.generation = generation if generation is not None else Generation()
        self.held = held  # the mirror's kept connection (`redisio.heldconn`)
        self.keys = keys
        self.scripts = scripts
        self.memory = memory
        self.stats = stats
        self.arming = arming
        self.queued_ttl = queued_ttl
        self._open: Writes | None = None  # the writes of `batch()` in progress

    def writes(self) -> Writes:
        return self._open if self._open is not None else Writes(self.keys, self.scripts)

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Every apply/delete call inside shares one `Writes`, sent at the end: a batch of watch events
        of several kinds is one pipeline, one command per key (dirty sets, `queued` flags and `pulse`
        once, not once per kind).  Relists are not wrapped: they send a pipeline per `chunk`."""
        if self._open is not None:
            yield
            return
        self._open = writes = Writes(self.keys, self.scripts)
        try:
            yield
        finally:
            self._open = None
        self.send(writes)

    def send(self, writes: Writes) -> int:
        """Run a batch; on a Redis error the memory is rebuilt from Redis before the next call (the batch
        may be half-applied there), and the error propagates (the caller applies the batch again).
        Inside `batch()`, the shared writes are sent when it ends (0 here)."""
        if writes is self._open:
            return 0
        arming = self.arming
        try:
            published, armed = writes.execute(
                self.redis,
                int(self.queued_ttl * 1000),
                arm=arming.gate_open,
                held=self.held,
                defer_dirty=arming.revalidate and arming.synced is False and self.memory.fresh,
            )
        except redis.RedisError:
            self.memory.clear()
            self.generation.unknown()
            raise
        if writes.generation is not None:
            self.generation.wrote(writes.generation)
        self.stats.published += published
        arming.enqueue_shards(armed)
        return published
