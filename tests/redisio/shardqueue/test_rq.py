"""Shard jobs through real RQ: msgpack on the wire, never pickle, run in-process by a SimpleWorker."""

from __future__ import annotations

import pickle
import subprocess
import sys
import zlib
from pathlib import Path

import msgpack
import pytest
import redis
import rq

from producer.mirror import Mirror
from producer.relist import Kind
from redisio.shardqueue.jobs import MsgpackSerializer, UnreadableJobPayload, enqueue_shard, shard_queue
from shared.clock import FakeClock
from shared.keys import Keys
from shared.shard import DEFAULT_SHARDS, shard_of
from tests.fixtures.redis import Cluster, Endpoint, decisions


def queues(client: redis.Redis, keys: Keys) -> list[rq.Queue]:
    return [shard_queue(client, keys, s) for s in range(DEFAULT_SHARDS)]


def work(client: redis.Redis, keys: Keys) -> None:
    worker = rq.SimpleWorker(queues(client, keys), connection=client, serializer=MsgpackSerializer)
    worker.work(burst=True)


def test_a_stored_job_is_msgpack(client: redis.Redis, keys: Keys) -> None:
    job = enqueue_shard(shard_queue(client, keys, 3), 3)
    data = client.hget(job.key, "data")
    assert data is not None
    assert msgpack.unpackb(zlib.decompress(data)) == [
        "workers.validate.shard_job",
        None,
        [3],
        {"prefix": "ipamgc"},
    ]
    assert client.lrange(f"rq:queue:{keys.queue_name(3)}", 0, -1) == [job.id.encode()]


def test_the_serializer_round_trips_job_tuples_and_results() -> None:
    payload = ("workers.validate.shard_job", None, (3,), {"prefix": "ipamgc"})
    assert MsgpackSerializer.loads(MsgpackSerializer.dumps(payload)) == [
        *payload[:2],
        [3],
        {"prefix": "ipamgc"},
    ]
    assert MsgpackSerializer.loads(MsgpackSerializer.dumps({"validated": 2, "gated": False})) == {
        "validated": 2,
        "gated": False,
    }


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (exec, (f"import pathlib; pathlib.Path({str(self.marker)!r}).touch()",))


def test_a_forged_pickle_payload_is_rejected_not_executed(
    client: redis.Redis, keys: Keys, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    forged = pickle.dumps((_Evil(marker), None, (), {}))
    with pytest.raises(UnreadableJobPayload):
        MsgpackSerializer.loads(forged)
    job = enqueue_shard(shard_queue(client, keys, 1), 1)
    client.hset(job.key, "data", zlib.compress(forged))  # someone with write access to Redis
    work(client, keys)
    assert not marker.exists()
    fetched = rq.job.Job.fetch(job.id, connection=client, serializer=MsgpackSerializer)
    with pytest.raises(rq.exceptions.DeserializationError):
        _ = fetched.func_name
    assert fetched.get_status() == rq.job.JobStatus.FAILED


def test_shard_jobs_run_in_a_simple_worker(
    client: redis.Redis, keys: Keys, cluster: Cluster, clock: FakeClock
) -> None:
    b = cluster.builder
    b.add_node("node-1")
    handle, ips = b.add_pod("default", "web-0", "node-1")

    def enqueue(shard: int) -> None:
        enqueue_shard(shard_queue(client, keys, shard), shard)

    mirror = Mirror(client, keys, enqueue=enqueue, clock=clock)
    mirror.set_config(900.0, True)
    mirror.relist(Kind.NODES, cluster.nodes())
    mirror.relist(Kind.PODS, cluster.pods())
    mirror.relist(Kind.BLOCKS, cluster.blocks())
    mirror.mark_synced()
    s = shard_of("node-1")
    assert len(shard_queue(client, keys, s)) == 1
    work(client, keys)
    assert decisions(client, keys) == []
    assert not client.exists(keys.queued(s))

    b.delete_node("node-1", with_pods=True)  # node and pods gone: released without a grace period
    mirror.delete_pod("default", "web-0")
    mirror.delete_node("node-1")
    [job] = [
        rq.job.Job.fetch(i, connection=client, serializer=MsgpackSerializer)
        for i in shard_queue(client, keys, s).job_ids
    ]
    work(client, keys)
    assert {d.alloc_id for d in decisions(client, keys)} == {
        f"{handle}/{ips[0]}",
        next(
            a.id for blk in cluster.blocks() for a in blk.iter_allocations() if a.handle.startswith("vxlan")
        ),
    }
    # result_ttl=0: a finished job leaves nothing behind (its counters are in the log and P:metrics).
    assert job.latest_result() is None
    assert not client.exists(job.key)


def test_a_worker_imports_its_job_before_it_takes_one(redis_endpoint: Endpoint, client: redis.Redis) -> None:
    """RQ would import the job's module inside the first job (80–130 ms of it); `run_workers` imports it at
    the start, so a worker that has taken no job already holds it."""
    done = _worker_process(
        redis_endpoint,
        "import sys",
        "assert 'workers.validate' not in sys.modules",
        "print(run_workers(settings, burst=True), 'workers.validate' in sys.modules)",
    )
    assert done.stdout.split() == ["False", "True"], done.stderr


def test_a_stop_asked_for_before_the_worker_starts_ends_it_before_any_job(
    redis_endpoint: Endpoint, client: redis.Redis
) -> None:
    """`ipamgc combined` keeps a SIGTERM that arrives before RQ's handlers exist (`stop_pending`): the
    worker then stops at its loop's top instead of waiting for jobs (it would block on its dequeue)."""
    done = _worker_process(
        redis_endpoint,
        "import threading",
        "pending = threading.Event(); pending.set()",
        "print(run_workers(settings, stop_pending=pending))",
    )
    assert done.returncode == 0 and done.stdout.split() == ["False"], done.stderr  # not blocked: no job run


def _worker_process(redis_endpoint: Endpoint, *lines: str) -> subprocess.CompletedProcess[str]:
    """`lines` run in a fresh interpreter after `run_workers` is imported and `settings` point at the test's
    Redis (a worker installs signal handlers and imports its job: neither may leak into this process)."""
    url = f"redis://{redis_endpoint.host}:{redis_endpoint.port}/0"
    head = ["from shared.config import Settings", "from workers.shards.run import run_workers"]
    code = "\n".join([*head, f"settings = Settings(redis_url={url!r})", *lines]) + "\n"
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
