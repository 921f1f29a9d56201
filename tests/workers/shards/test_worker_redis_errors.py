"""A worker goes on when Redis fails under RQ's loop (`workers.shards.run._Worker`): a master killed in a
failover, no master yet, a Redis at its maxmemory refusing RQ's bookkeeping (`OOM command not allowed`).
RQ's own loop quits the process on any of these but a dequeue's lost connection, so a failover or an OOM
window restarted every busy worker, and a worker started in it exited again."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
import redis
import rq

from redisio.shardqueue.jobs import MsgpackSerializer, shard_queue
from shared.keys import Keys
from tests.polling import wait_until
from workers.shards.run import _Worker

OOM = redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'.")


def _worker(client: redis.Redis, keys: Keys) -> _Worker:
    return _Worker([shard_queue(client, keys, 0)], connection=client, serializer=MsgpackSerializer)


def test_a_worker_started_while_redis_refuses_writes_waits_for_it_instead_of_exiting(
    client: redis.Redis, keys: Keys, caplog: pytest.LogCaptureFixture
) -> None:
    worker = _worker(client, keys)
    before = client.config_get("maxmemory")["maxmemory"]
    registering = threading.Thread(target=worker.register_birth, daemon=True)  # the first step of `work`
    try:
        client.config_set("maxmemory", 1)  # every write refused (noeviction)
        with caplog.at_level(logging.WARNING, logger="rq.worker"):
            registering.start()
            wait_until(lambda: "retrying in" in caplog.text, timeout=10, what="the registration refused")
            assert registering.is_alive()  # waiting, not gone
    finally:
        client.config_set("maxmemory", before)
    registering.join(timeout=20)
    assert not registering.is_alive()
    assert client.exists(worker.key)  # registered once Redis took writes
    worker.register_death()


def test_redis_failing_while_rq_records_a_job_or_dequeues_does_not_end_the_worker(
    client: redis.Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    failures = [OOM, redis.ConnectionError("Connection closed by server."), redis.TimeoutError("t")]
    dequeues: list[int] = []

    def dequeue(self: rq.SimpleWorker, timeout: int | None, max_idle_time: int | None = None) -> Any:
        dequeues.append(1)
        if failures:
            raise failures.pop(0)  # the state write RQ's dequeue makes outside its own retry
        return None  # burst: no job, the loop ends

    def execute(self: rq.SimpleWorker, job: Any, queue: Any) -> None:
        raise OOM  # RQ writing the job's outcome, refused

    monkeypatch.setattr(rq.SimpleWorker, "dequeue_job_and_maintain_ttl", dequeue)
    monkeypatch.setattr(rq.SimpleWorker, "execute_job", execute)
    monkeypatch.setattr("workers.shards.run.REDIS_RETRY_MIN_SECONDS", 0.001)
    worker = _worker(client, keys)
    worker.execute_job(rq.job.Job.create("workers.noop", connection=client), shard_queue(client, keys, 0))
    assert worker.work(burst=True) is False
    assert len(dequeues) == 4 and failures == []
