"""What the chaos runs found, pinned down deterministically.

1. Redis restarted empty under a running watcher: the watcher went on publishing deltas into an empty
   Redis and never marked it synced again, so workers and leader stayed gated (nothing collected) until
   someone restarted the watcher.  Now it notices at its next kick and exits (75) to relist.
2. A worker killed while its shard job held no lease (between two batches) left the shard's `queued` flag
   for its full TTL (300 s): no job was enqueued for the shard, and `kick` only re-arms a shard whose
   job left an expired lease behind.  Now a running job keeps its flag one lease ahead, so the shard is
   re-armed within a lease.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import redis

from lab.apiserver.apiserver import SimApiServer
from lab.cluster.cluster import SimCluster
from producer.mirror import Mirror
from producer.watcher import EXIT_MIRROR_LOST
from redisio.shardqueue.lua import KICK_UNSTARTED_SECONDS
from shared.keys import QUEUED_TTL_SECONDS, STATE_SYNCED
from shared.shard import shard_of
from tests.fixtures.leader import Env
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


def test_the_watcher_exits_to_relist_when_redis_loses_the_mirror(
    server: SimApiServer, sim: SimCluster, client: redis.Redis, redis_url: str
) -> None:
    sim.bootstrap("15m0s")
    sim.populate(nodes=2, pods_per_node=2)
    settings = fast_settings(redis_url)
    with running_watcher(server, settings) as rw:
        wait_until(rw.watcher.synced.is_set, timeout=10)
        client.flushall()  # what a redis-server restarted without persistence looks like
        rw.thread.join(timeout=10)
        assert rw.exit_code == EXIT_MIRROR_LOST
    # Its successor (the supervisor's restart) lists everything again: the mirror is whole and synced.
    with running_watcher(server, settings) as again:
        wait_until(lambda: client.hget(KEYS.state, STATE_SYNCED) == b"1", timeout=10)
        assert client.hlen(KEYS.pods) == 4 and again.exit_code is None


def test_the_watcher_exits_to_relist_even_when_the_backstop_kicks_more_often_than_its_own_kick(
    server: SimApiServer, sim: SimCluster, client: redis.Redis, redis_url: str
) -> None:
    """Found by the soak (deployment timings: a 30 s kick, a backstop every grace / 2 = 1 s): each backstop
    pass kicked without looking for `synced` and moved the watcher's own kick 30 s ahead, so a Redis
    restarted empty was never noticed and nothing was collected again.  Every kick looks now."""
    sim.bootstrap("15m0s")
    sim.populate(nodes=2, pods_per_node=2)
    settings = fast_settings(redis_url, kick_interval_seconds=30.0, resync_period_seconds=0.3)
    with running_watcher(server, settings) as rw:
        wait_until(rw.watcher.synced.is_set, timeout=10)
        client.flushall()
        rw.thread.join(timeout=10)
        assert rw.exit_code == EXIT_MIRROR_LOST


def test_redis_lost_while_the_watcher_lists_is_noticed_before_it_marks_the_mirror_synced(
    server: SimApiServer, sim: SimCluster, client: redis.Redis, redis_url: str
) -> None:
    """Nodes and blocks are mirrored, then Redis comes back empty while the pod list is still coming: the
    watcher must not call that mirror synced (nodes missing would read as nodes gone)."""
    sim.bootstrap("15m0s")
    sim.populate(nodes=2, pods_per_node=2)
    server.faults.add(verbs=["list"], resources=["pods"], latency=1.5, times=1)
    with running_watcher(server, fast_settings(redis_url)) as rw:
        wait_until(lambda: client.hlen(KEYS.nodes) == 2 and client.hlen(KEYS.blocks) > 0, timeout=10)
        assert client.hget(KEYS.state, STATE_SYNCED) != b"1"  # the pods are still being listed
        client.flushall()
        rw.thread.join(timeout=10)
        assert rw.exit_code == EXIT_MIRROR_LOST
    assert client.hget(KEYS.state, STATE_SYNCED) != b"1"


HOLDING = "test:victim-between-batches"
# A real worker (SimpleWorker, real RQ, real shard job) that freezes at the top of a later loop iteration
# of its job, once the cold start's work of its shard is validated and acked (nothing dirty, leased or
# left of the revalidation pass), so it holds no lease when it is killed.  A lingering job reads the
# state gate inside each look's pipeline (`linger.parse_state`), a draining job with `read_state`: the
# hook freezes at either.
VICTIM = f"""
import sys, threading
import redis
from shared.config import Settings
from shared.keys import Keys
from workers.shards import linger, validate
from workers.shards.run import run_workers

url, shard = sys.argv[1], int(sys.argv[2])
real, real_parse = validate.read_state, linger.parse_state
calls = []
keys = Keys()

def freeze():
    calls.append(1)
    r = redis.Redis.from_url(url, protocol=2)
    left = r.zcard(keys.inflight(shard)), r.scard(keys.dirty(shard)), r.exists(keys.revalidate(shard))
    drained = not any(left)
    if len(calls) >= 2 and drained:
        r.set({HOLDING!r}, "1")
        threading.Event().wait()

def frozen(client, keys):
    freeze()
    return real(client, keys)

def frozen_parse(values):
    freeze()
    return real_parse(values)

validate.read_state = frozen
linger.parse_state = frozen_parse
run_workers(Settings(redis_url=url, work_lease_seconds=2.0), [shard])
"""


def test_a_worker_killed_between_batches_does_not_stall_its_shard(
    server: SimApiServer, sim: SimCluster, client: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    sim.bootstrap("15m0s")
    sim.populate(nodes=3, pods_per_node=2)
    node = "node-00001"
    shard = shard_of(node)
    victim = subprocess.Popen([sys.executable, "-c", VICTIM, redis_url, str(shard)], cwd=ROOT)
    try:
        with running_watcher(server, fast_settings(redis_url)):
            wait_until(lambda: client.get(HOLDING), timeout=15)
            victim.send_signal(signal.SIGKILL)
            victim.wait(timeout=10)
            assert client.zcard(KEYS.inflight(shard)) == 0  # no lease left behind for the reaper
            assert 0 < client.pttl(KEYS.queued(shard)) <= 2000  # the dead job's flag lives one lease
            leaked = allocation_ids(sim, node=node)
            sim.leak_node_deleted(node)  # confirmed at once when validated: no grace period involved
            with worker_processes(redis_url, [None], tmp_path) as workers:
                # The flag expires within the lease, `kick` (every 0.1 s) re-arms the shard: decided in
                # seconds, not after the flag's 300 s TTL.
                wait_until(lambda: {d.alloc_id for d in decisions(client, KEYS)} >= leaked, timeout=10)
                assert workers.output() == "" or "Traceback" not in workers.output()
    finally:
        stop_processes([victim])


def _dead_node_decided(env: Env) -> None:
    sim = env.sim
    sim.add_node("node-a")
    sim.add_node("node-dead")
    sim.create_pod("ns", "p1", "node-dead")
    sim.create_pod("ns", "p2", "node-dead")
    env.decide()
    sim.leak_node_deleted("node-dead")
    assert env.decide() == 3  # two pod IPs and the tunnel IP


def test_a_handle_write_refused_unprocessed_is_retried(env: Env) -> None:
    _dead_node_decided(env)
    env.server.faults.add(
        verbs=["update"], resources=["ipamhandles"], error_rate=1.0, error_code=503, times=3
    )
    env.leader().step()
    assert env.sim.truth.leaked_ips() == set() and env.sim.truth.violations == []
    assert len(env.server.find_requests(method="PUT", resource="ipamhandles", status=503)) == 3
    assert env.consistent() == []


def test_an_ambiguous_handle_write_failure_is_not_repeated(env: Env) -> None:
    """A 500 may have been applied: a second decrement could under-count, so the handle is left (logged),
    over-counted at worst — the direction in which nothing is ever released on its account."""
    _dead_node_decided(env)
    env.server.faults.add(
        verbs=["update"], resources=["ipamhandles"], error_rate=1.0, error_code=500, times=1
    )
    env.leader().step()
    assert env.sim.truth.leaked_ips() == set() and env.sim.truth.violations == []
    [failed] = env.server.find_requests(method="PUT", resource="ipamhandles", status=500)
    assert [
        r for r in env.server.find_requests(resource="ipamhandles", name=failed.name) if r.method != "GET"
    ] == [failed]
    problems = env.consistent()
    assert (
        len(problems) == 1
        and problems[0].startswith("handle-count")
        and "says 1, block holds 0" in problems[0]
    )


def test_a_queued_flag_no_job_ever_ran_under_is_re_armed(client: redis.Redis) -> None:
    enqueued: list[int] = []
    mirror = Mirror(client, KEYS, enqueue=enqueued.append, job_lease=2.0)
    full = int(QUEUED_TTL_SECONDS * 1000)
    unstarted = int(KICK_UNSTARTED_SECONDS * 1000)
    cases = {
        0: (full - unstarted - 1000, True),  # armed 11 s ago, no job ever held it: re-armed
        1: (full - 2000, False),  # armed 2 s ago: its job may simply not have started yet
        2: (1500, False),  # held by a running job (within one lease of 2 s)
        3: (full - unstarted - 1000, False),  # old, but nothing to do in the shard
    }
    for shard, (pttl, _) in cases.items():
        client.set(KEYS.queued(shard), "1", px=pttl)
        if shard != 3:
            client.sadd(KEYS.dirty(shard), f"h/10.0.0.{shard}")
    assert mirror.kick() == [s for s, (_, rearm) in cases.items() if rearm] == enqueued
    assert client.pttl(KEYS.queued(0)) > full - 1000  # its new job holds a fresh flag
