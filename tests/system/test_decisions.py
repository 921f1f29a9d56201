"""Watcher and RQ worker processes together decide exactly the leaks the simulated cluster injected, once
each, and nothing before the initial lists are mirrored or while the datastore is not ready."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import pytest
import redis

from lab.apiserver.apiserver import SimApiServer
from lab.cluster.cluster import SimCluster
from producer.kinds import Kind
from shared.gcrecords import decode_decision
from shared.shard import shard_of
from tests.fixtures.redis import decisions
from tests.fixtures.stack import (
    KEYS,
    allocation_ids,
    caught_up,
    fast_settings,
    quiescent,
    releasable_ips,
    running_watcher,
    worker_processes,
)
from tests.polling import wait_until
from workers.shards.run import run_workers


def test_worker_processes_decide_exactly_the_injected_leaks_once(
    server: SimApiServer, sim: SimCluster, client: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    sim.bootstrap("1s")  # a tiny grace period, real time: candidates confirm a second after they start
    sim.populate(nodes=4, pods_per_node=4)
    sim.windows_node("win-0")
    with (
        running_watcher(server, fast_settings(redis_url)) as rw,
        worker_processes(redis_url, ["0-7", "8-15", None], tmp_path) as workers,
    ):
        w = rw.watcher
        wait_until(lambda: w.synced.is_set() and caught_up(w, server) and quiescent(client), timeout=20)
        assert decisions(client, KEYS) == [], workers.output()

        # Leaks (pod-0000000…3 run on node-00000, 4…7 on node-00001, and so on).
        sim.leak_pod_deleted_without_cni_del("ns-0", "pod-0000000")
        sim.leak_node_deleted("node-00003")  # its pods removed after: pod IPs and its tunnel IP
        sim.leak_ip_changed("ns-5", "pod-0000005")
        sim.leak_terminal_pod("ns-9", "pod-0000009")
        # Look-alikes that must stay.
        stale = sim.stale_node_attribute("ns-x", "stale", node="node-00000", attr_node="node-00001")
        dual = sim.dual_stack_single_status("ns-x", "dual", "node-00002")
        windows = {ip for ip, lives in sim.truth.usages.items() if lives[-1].owner == "reserved:win-0"}
        expected = sim.truth.leaked_ips()
        assert len(expected) == 1 + 5 + 1 + 1

        def settled() -> bool:
            return caught_up(w, server) and quiescent(client) and bool(decisions(client, KEYS))

        wait_until(settled, timeout=30)
        found = decisions(client, KEYS)
        assert releasable_ips(client, found) == expected, workers.output()
        decided = {d.ip for d in found}
        assert not decided & (set(stale) | windows | {dual[0]})
        # The dual-stack pod's unreported IPv6 is a confirmed allocation-level leak, kept by handle
        # all-or-none (its IPv4 sibling is valid): the leader never releases it (#5044).
        assert decided - expected == {dual[1]}
        assert all(n == 1 for n in Counter(d.alloc_id for d in found).values())
        reasons = {d.ip: d.reason for d in found}
        assert {reasons[ip] for ip in expected} == {
            "pod-missing",
            "node-missing",
            "pod-ip-mismatch",
            "pod-terminated",
        }

        # Duplicated events (a relist after 410 replays every object) and a full resync decide nothing
        # again.
        for kind in ("nodes", "pods", "ipamblocks"):
            server.faults.add(verbs={"watch"}, resources={kind}, expire=True, times=1)
            server.drop_watches(kind)
        w.request_resync()
        relisted = [Kind.NODES, Kind.PODS, Kind.BLOCKS]
        wait_until(lambda: all(w.stats.get("relists", k) >= 1 for k in relisted), timeout=10)
        wait_until(
            lambda: w.stats.get("resyncs") >= 1 and caught_up(w, server) and quiescent(client), timeout=20
        )
        again = decisions(client, KEYS)
        assert [d.alloc_id for d in again] == [d.alloc_id for d in found]


def _queued_jobs(client: redis.Redis, shards: int) -> int:
    return sum(int(client.llen(f"rq:queue:{KEYS.queue_name(s)}")) for s in range(shards))


def _gated_job_ran(caplog: pytest.LogCaptureFixture) -> bool:
    """Some shard job reported it was gated (datastore not ready, or mirror not synced).  Jobs store no
    result (result_ttl=0), so this reads the job's log line instead of its RQ result."""
    return any(r.name == "workers.validate" and "shard job idle" in r.getMessage() for r in caplog.records)


def test_nothing_is_decided_before_the_initial_lists_complete(
    server: SimApiServer,
    sim: SimCluster,
    client: redis.Redis,
    redis_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="workers.validate")
    sim.bootstrap("15m0s")
    sim.populate(nodes=2, pods_per_node=2)
    leaked = allocation_ids(sim, node="node-00001")
    sim.leak_node_deleted("node-00001")  # confirmed at once, without grace, once validated
    down = server.faults.add(verbs={"list"}, resources={"pods"}, error_rate=1.0, error_code=500)
    settings = fast_settings(redis_url)
    with running_watcher(server, settings) as rw:
        w = rw.watcher
        # Blocks and nodes are mirrored, pods are not.  A first list on a Redis never synced writes no
        # dirty id (the pass that opening the gate starts covers them): dirty ids an earlier watcher left.
        wait_until(lambda: w.stats.get("lists", "ipamblocks") == 1 and w.stats.get("errors", "pods") >= 1)
        wait_until(lambda: any(client.hlen(KEYS.alloc(s)) for s in range(w.mirror.shards)), timeout=5)
        for alloc_id in leaked:
            client.sadd(KEYS.dirty(shard_of("node-00001", w.mirror.shards)), alloc_id)
        # The gate is shut: the watcher queues no shard job, none would do anything ...
        assert not _queued_jobs(client, w.mirror.shards)
        # ... and jobs that run anyway (queued by an earlier watcher, say) do nothing.
        w.mirror.enqueue_shards(range(w.mirror.shards))
        assert run_workers(settings, burst=True)  # every queued job ran, and did nothing
        assert _gated_job_ran(caplog)
        assert not w.synced.is_set() and client.hget(KEYS.state, "synced") is None
        assert decisions(client, KEYS) == []
        server.faults.remove(down.id)
        wait_until(w.synced.is_set, timeout=10)
        run_workers(settings, burst=True)
        assert {d.alloc_id for d in decisions(client, KEYS)} == leaked


def test_nothing_is_decided_while_the_datastore_is_not_ready(
    server: SimApiServer,
    sim: SimCluster,
    client: redis.Redis,
    redis_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="workers.validate")
    sim.bootstrap("15m0s", datastore_ready=False)
    sim.populate(nodes=2, pods_per_node=2)
    leaked = allocation_ids(sim, node="node-00001")
    sim.leak_node_deleted("node-00001")
    settings = fast_settings(redis_url)
    with running_watcher(server, settings) as rw:
        w = rw.watcher
        wait_until(lambda: w.synced.is_set() and caught_up(w, server), timeout=10)
        assert client.hget(KEYS.state, "datastore_ready") == b"0"
        assert not _queued_jobs(client, w.mirror.shards)  # the gate is shut: no job is queued ...
        w.mirror.enqueue_shards(range(w.mirror.shards))  # ... and jobs that run anyway do nothing
        assert run_workers(settings, burst=True)
        assert _gated_job_ran(caplog)
        assert decisions(client, KEYS) == []
        info = sim.store.get("clusterinformations", None, "default")
        info["spec"]["datastoreReady"] = True
        sim.store.replace("clusterinformations", None, "default", info)
        wait_until(lambda: client.hget(KEYS.state, "datastore_ready") == b"1", timeout=10)
        run_workers(settings, burst=True)
        found = decisions(client, KEYS)
        assert {d.alloc_id for d in found} == leaked
        assert {decode_decision(f[b"d"]).reason for _i, f in client.xrange(KEYS.decisions)} <= {
            "pod-missing",
            "node-missing",
        }
