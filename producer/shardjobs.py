"""The shard jobs the watcher enqueues on RQ, with msgpack, exactly as the workers define them.

Why a module: the producer does not import `workers` (an import-linter contract), so the job's dotted path,
its TTLs and the wire format are repeated here, in one place, and pinned equal to
`workers/shards/rq_serializer.py` by a contract test (tests/e2e/test_contracts.py).  The `Mirror` only calls
`enqueue(shard)`; this is the RQ side of that call, which the watcher wires in.
"""

from __future__ import annotations

import threading
from typing import Any

import redis
import rq

from shared.codec import pack, unpack
from shared.keys import Keys

# The shard job and its RQ options; must equal workers/shards/rq_serializer.py (pinned by tests/e2e).
SHARD_JOB = "workers.validate.shard_job"
JOB_TIMEOUT_SECONDS = 120
RESULT_TTL_SECONDS = 0
FAILURE_TTL_SECONDS = 86_400


class MsgpackJobSerializer:
    """RQ `Serializer` with msgpack (never pickle), wire-compatible with the workers' serializer."""

    @staticmethod
    def dumps(obj: Any, /) -> bytes:
        return pack(obj)

    @staticmethod
    def loads(data: bytes, /) -> Any:
        return unpack("job", data)


class ShardEnqueuer:
    """`enqueue(shard)` for the Mirror: one RQ job on the shard's queue (callers hold its `queued` flag)."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys
        self._queues: dict[int, rq.Queue] = {}
        self._lock = threading.Lock()

    def __call__(self, shard: int) -> None:
        with self._lock:
            q = self._queues.get(shard)
            if q is None:
                name = self.keys.queue_name(shard)
                q = self._queues[shard] = rq.Queue(
                    name, connection=self.client, serializer=MsgpackJobSerializer
                )
            q.enqueue(
                SHARD_JOB,
                shard,
                prefix=self.keys.prefix,
                job_timeout=JOB_TIMEOUT_SECONDS,
                result_ttl=RESULT_TTL_SECONDS,
                failure_ttl=FAILURE_TTL_SECONDS,
                description=f"validate shard {shard}",
            )
