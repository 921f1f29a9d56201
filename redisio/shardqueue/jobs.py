"""The shard job on RQ: its dotted path, options and TTLs, its wire format, and its enqueueing, for the
watcher that enqueues it and the workers that run it (both import this module; neither repeats it).

RQ with msgpack instead of pickle: whoever can write to Redis must not be able to run code in a worker.

RQ's default serializer unpickles job payloads, so a forged job hash executes arbitrary code on
`Job.fetch`.  `MsgpackSerializer` implements RQ's `Serializer` protocol (`dumps(obj) -> bytes`,
`loads(bytes) -> obj`) with msgpack, which decodes only data (no classes, no extension types).  Shard
jobs carry plain arguments (a shard number, a key prefix) and return a dict of counters, so nothing
else is needed.  Every process that touches the queues must pass `serializer=MsgpackSerializer` (the
queues of `shard_queue` do).

Data-only payloads are not enough on their own: RQ imports and calls the function a job's payload names
(and its callbacks, named in the job hash), so a forged msgpack job `["os.system", None, ["..."], {}]`
would still run code.  Workers therefore run `ShardJob`, which refuses any job but `SHARD_JOB(shard,
prefix=...)` before anything is imported, and drops callback names (ours set none).
"""

from __future__ import annotations

import threading
from typing import Any, cast

import msgpack  # type: ignore[import-untyped]
import redis
import rq

from shared.errors import PermanentError
from shared.keys import Keys

# Dotted path of the shard job, so this module does not import the job (and RQ stores a string anyway); it
# stays `workers.validate`, where the job lived before #37, so jobs queued by either version run on both.
SHARD_JOB = "workers.validate.shard_job"
# A shard job stops after its time budget (seconds) and re-enqueues itself; this is only a hard stop.
JOB_TIMEOUT_SECONDS = 120
# No stored results: with 0 RQ deletes a finished job at once instead of writing its result and the
# finished registry (fewer Redis commands per job); a job's counters go to its log and `P:metrics`.
RESULT_TTL_SECONDS = 0
# Failed jobs are kept a day for inspection (RQ's default is a year).
FAILURE_TTL_SECONDS = 86_400


class UnreadableJobPayload(PermanentError):
    """A job payload in Redis that is not msgpack data (a forged pickle, corruption): never executed."""


def _reject_ext(code: int, data: bytes) -> object:
    raise UnreadableJobPayload(f"msgpack extension type {code} in a job payload")


class MsgpackSerializer:
    """RQ `Serializer`: msgpack, data only."""

    @staticmethod
    def dumps(obj: Any, /) -> bytes:
        return cast(bytes, msgpack.packb(obj, use_bin_type=True))

    @staticmethod
    def loads(data: bytes, /) -> Any:
        try:
            return msgpack.unpackb(data, raw=False, strict_map_key=False, ext_hook=_reject_ext)
        except UnreadableJobPayload:
            raise
        except (ValueError, TypeError, msgpack.exceptions.UnpackException) as exc:
            raise UnreadableJobPayload(f"job payload is not msgpack: {exc}") from exc


def _is_shard_job(func_name: object, instance: object, args: object, kwargs: object) -> bool:
    return (
        func_name == SHARD_JOB
        and instance is None
        and isinstance(args, list | tuple)
        and len(args) == 1
        and isinstance(args[0], int)
        and not isinstance(args[0], bool)
        and isinstance(kwargs, dict)
        and set(kwargs) <= {"prefix"}
        and all(isinstance(v, str) for v in kwargs.values())
    )


class ShardJob(rq.job.Job):
    """The only job a worker runs (see the module docstring): anything else fails as undeserializable,
    before its function is imported."""

    def _deserialize_data(self) -> None:
        try:
            value = self.serializer.loads(self.data)
        except Exception as exc:  # as RQ's own: any serializer error is a DeserializationError
            raise rq.exceptions.DeserializationError() from exc
        if not (isinstance(value, list | tuple) and len(value) == 4 and _is_shard_job(*value)):
            name = value[0] if isinstance(value, list | tuple) and value else type(value).__name__
            raise rq.exceptions.DeserializationError(f"job {self.id}: {name!r} is not a shard job, refused")
        self._func_name, self._instance, self._args, self._kwargs = value

    def restore(self, raw_data: Any) -> Any:
        out = super().restore(raw_data)
        self._success_callback_name = self._failure_callback_name = self._stopped_callback_name = None
        return out


def shard_queue(client: redis.Redis, keys: Keys, shard: int) -> rq.Queue:
    """The RQ queue of one shard, with the msgpack serializer."""
    return rq.Queue(
        keys.queue_name(shard), connection=client, serializer=MsgpackSerializer, job_class=ShardJob
    )


def enqueue_shard(queue: rq.Queue, shard: int, prefix: str = "ipamgc") -> rq.job.Job:
    """Enqueue one shard job.  Callers enqueue only after setting the shard's `queued` flag (SET NX)."""
    return queue.enqueue(
        SHARD_JOB,
        shard,
        prefix=prefix,
        job_timeout=JOB_TIMEOUT_SECONDS,
        result_ttl=RESULT_TTL_SECONDS,
        failure_ttl=FAILURE_TTL_SECONDS,
        description=f"validate shard {shard}",
    )


class ShardEnqueuer:
    """`enqueue(shard)` for the watcher's `Mirror`: one shard job on the shard's queue (callers hold its
    `queued` flag: `arm_in`, `ShardFlags.kick_in`).  Its queues are made once; thread-safe."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys
        self._queues: dict[int, rq.Queue] = {}
        self._lock = threading.Lock()

    def __call__(self, shard: int) -> None:
        with self._lock:
            q = self._queues.get(shard)
            if q is None:
                q = self._queues[shard] = shard_queue(self.client, self.keys, shard)
            enqueue_shard(q, shard, self.keys.prefix)
