"""A worker killed outright in the middle of a batch loses nothing: once its lease expires the batch is
handed to another worker process and decided there, once."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import redis

from lab.apiserver.apiserver import SimApiServer
from lab.cluster.cluster import SimCluster
from shared.shard import shard_of
from tests.fixtures.redis import decisions
from tests.fixtures.stack import (
    KEYS,
    ROOT,
    allocation_ids,
    fast_settings,
    running_watcher,
    stop_processes,
    worker_processes,
)
from tests.polling import wait_until

HOLDING = "test:victim-holding"
# A real worker (SimpleWorker, real RQ, real shard job) whose validation step freezes once it holds a
# lease: it records the lease in Redis and waits to be killed.
VICTIM = f"""
import sys, threading
import redis
from shared.config import Settings
from workers.shards import validate
from workers.shards.run import run_workers

url, shard = sys.argv[1], int(sys.argv[2])

def frozen(self, lease, state, now):
    client = redis.Redis.from_url(url, protocol=2)
    client.set({HOLDING!r}, lease.token + " " + " ".join(lease.ids))
    threading.Event().wait()

def frozen_batches(batches, state, now):  # a lingering job validates its held shards together
    if not batches:  # a look that took nothing (a cold start's first look refills from the pass)
        return []
    job, lease = batches[0]
    frozen(job, lease, state, now)

validate._ShardJob.validate = frozen
validate.validate_batches = frozen_batches
run_workers(Settings(redis_url=url, work_lease_seconds=2.0), [shard])
"""


def test_a_batch_held_by_a_killed_worker_is_redone_after_its_lease_expires(
    server: SimApiServer, sim: SimCluster, client: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    sim.bootstrap("15m0s")
    sim.populate(nodes=3, pods_per_node=2)
    leaked = allocation_ids(sim, node="node-00001")
    sim.leak_node_deleted("node-00001")  # confirmed at once when validated: no grace period involved
    shard = shard_of("node-00001")
    # The lost job's "queued" flag lives 300 s by default: `kick` re-arms the shard as soon as the dead
    # worker's lease has been expired for a few seconds, without waiting for the flag.
    settings = fast_settings(redis_url)
    victim = subprocess.Popen([sys.executable, "-c", VICTIM, redis_url, str(shard)], cwd=ROOT)
    try:
        with running_watcher(server, settings):
            held = wait_until(lambda: client.get(HOLDING), timeout=15).decode().split()
            deadline, ids = float(held[0]), set(held[1:])
            assert leaked <= ids
            victim.send_signal(signal.SIGKILL)
            victim.wait(timeout=10)
            assert client.zcard(KEYS.inflight(shard)) == len(ids)  # the lease outlives its worker
            with worker_processes(redis_url, [None], tmp_path) as workers:
                wait_until(lambda: {d.alloc_id for d in decisions(client, KEYS)} >= leaked, timeout=20)
                found = [d for d in decisions(client, KEYS) if d.shard == shard]
                assert {d.alloc_id for d in found} == leaked, workers.output()
                assert all(n == 1 for n in Counter(d.alloc_id for d in found).values())
                assert min(d.decided_at for d in found) >= deadline  # redone only once the lease expired
                wait_until(lambda: client.zcard(KEYS.inflight(shard)) == 0, timeout=5)
    finally:
        stop_processes([victim])
