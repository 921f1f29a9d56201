"""A worker's exit does not wait on its RQ command-channel thread (workers.run._Worker.subscribe)."""

from __future__ import annotations

import threading

import redis

from redisio.shardqueue.jobs import MsgpackSerializer, shard_queue
from shared.keys import Keys
from tests.polling import wait_until
from workers.shards.run import PUBSUB_POLL_SECONDS, _Worker

EXIT_DEADLINE_SECONDS = 10.0  # RQ's own poll period, 60 s, is what this guards against


def test_a_worker_stops_its_command_thread_even_after_the_thread_saw_the_unsubscribe(
    client: redis.Redis, keys: Keys
) -> None:
    """The race RQ 3.0 loses with redis-py 8.2 one exit in two: the thread reads the UNSUBSCRIBE reply
    before the stop flag is cleared, then waits a poll period for a new subscription; `stop()` joins it."""
    assert PUBSUB_POLL_SECONDS < EXIT_DEADLINE_SECONDS
    worker = _Worker([shard_queue(client, keys, 0)], connection=client, serializer=MsgpackSerializer)
    worker.subscribe()
    wait_until(lambda: worker.pubsub.subscribed, what="the command channel subscribed")
    worker.pubsub.unsubscribe()
    wait_until(lambda: not worker.pubsub.subscribed, what="the thread read the UNSUBSCRIBE reply")
    exiting = threading.Thread(target=worker.unsubscribe, daemon=True)  # what RQ's teardown calls
    exiting.start()
    exiting.join(timeout=EXIT_DEADLINE_SECONDS)
    assert not exiting.is_alive(), "the worker's exit is waiting on its command-channel thread"
    assert worker.pubsub_thread is not None and not worker.pubsub_thread.is_alive()
