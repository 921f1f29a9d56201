"""The active watcher's metrics against the simulated cluster and real Redis: Calico's gauges equal a
from-scratch computation, follow events, survive a fail-over (the new watcher's relist rebuilds them),
and the counters the workers and the leader keep in Redis come out of the watcher's collector."""

from __future__ import annotations

import time

import redis

from lab.apiserver.apiserver import SimApiServer
from lab.cluster.cluster import SimCluster
from shared.clock import FakeClock
from shared.keys import Keys
from shared.shard import DEFAULT_SHARDS
from tests.fixtures.stack import caught_up, fast_settings
from tests.fixtures.watcher_metrics import Running, expected_gauges, watcher_with_metrics
from tests.polling import wait_until
from workers.leader.audit import AuditRecord, Result
from workers.leader.metrics import LeaderMetrics
from workers.shards.validate import validate_shard

KEYS = Keys()
V4 = "default-ipv4-ippool"


def settled(r: Running, server: SimApiServer) -> bool:
    return r.watcher.synced.is_set() and caught_up(r.watcher, server)


def calico(r: Running) -> dict[str, dict[tuple[str, ...], float]]:
    return {
        "in_use": r.family("ipam_allocations_in_use"),
        "borrowed": r.family("ipam_allocations_borrowed"),
        "blocks": r.family("ipam_blocks"),
    }


def nonzero(values: dict[tuple[str, ...], float]) -> dict[tuple[str, ...], float]:
    return {k: v for k, v in values.items() if v}


def assert_matches_store(r: Running, sim: SimCluster) -> None:
    expected = expected_gauges(sim.store)
    got = calico(r)
    for name in ("in_use", "borrowed", "blocks"):
        assert nonzero(got[name]) == dict(expected[name]), name


def test_calico_gauges_follow_the_cluster_and_survive_a_failover(
    server: SimApiServer, sim: SimCluster, client: redis.Redis, redis_url: str
) -> None:
    sim.bootstrap("15m")
    sim.populate(nodes=3, pods_per_node=4)
    sim.create_pod("ns-x", "dual", "node-00001", dual_stack=True)
    sim.stale_node_attribute("ns-x", "stale", node="node-00000", attr_node="node-00002")  # borrowed
    settings = fast_settings(redis_url, election=True)
    with watcher_with_metrics(server, settings) as a:
        wait_until(lambda: settled(a, server), timeout=15)
        a.metrics.refresh()  # as the refresh thread does once synced (here: whatever it has done yet)
        assert_matches_store(a, sim)
        assert a.family("ipam_ippool_size") == {(V4,): 2**22, ("default-ipv6-ippool",): 2**24}
        # Every known node is pre-seeded with 0 in the real pools, as Calico does.
        in_use = a.family("ipam_allocations_in_use")
        assert all(
            (pool, f"node-0000{i}") in in_use for pool in (V4, "default-ipv6-ippool") for i in range(3)
        )

        # Events move the gauges without a refresh: the tally is updated as blocks are mirrored.
        sim.create_pod("ns-x", "late", "node-00002")
        sim.delete_pod("ns-0", "pod-0000000")
        wait_until(lambda: caught_up(a.watcher, server), timeout=10)
        wait_until(lambda: nonzero(calico(a)["in_use"]) == dict(expected_gauges(sim.store)["in_use"]), 10)
        assert_matches_store(a, sim)
        before = calico(a)

        # A standby exposes its own counters, never the cluster's.
        with watcher_with_metrics(server, settings) as b:
            wait_until(lambda: b.family("ipamgc_watcher_is_leader") == {(): 0.0}, timeout=5)
            b.metrics.refresh()
            assert b.family("ipam_allocations_in_use") == {}
            assert b.family("ipamgc_shard_dirty") == {}
            assert b.family("ipamgc_watch_events_total") == {
                (k,): 0.0 for (k,) in a.family("ipamgc_watch_events_total")
            }

            # Fail-over: the Redis mirror is already complete, so nothing changes in it, yet the new
            # watcher's relist observes every block and its gauges equal the old ones.
            a.watcher.stop()
            wait_until(lambda: settled(b, server) and b.watcher.leading, timeout=15)
            b.metrics.refresh()
            assert calico(b) == before
            lists = b.family("ipamgc_watch_lists_total")
            assert len(lists) == 6 and set(lists.values()) == {1.0}  # the six watched kinds


def test_candidates_decisions_batches_and_reclamations_come_from_redis(
    server: SimApiServer, sim: SimCluster, client: redis.Redis, redis_url: str
) -> None:
    sim.bootstrap("1m")
    sim.populate(nodes=2, pods_per_node=3)
    leaked = sim.leak_pod_deleted_without_cni_del("ns-1", "pod-0000001")  # on node-00000
    with watcher_with_metrics(server, fast_settings(redis_url)) as r:
        wait_until(lambda: settled(r, server), timeout=15)
        clock = FakeClock(time.time())

        def validate_all() -> int:
            return sum(validate_shard(s, client=client, clock=clock).decisions for s in range(DEFAULT_SHARDS))

        assert validate_all() == 0  # the leak is a candidate: its grace period has just begun
        reading = r.metrics.refresh()
        assert nonzero(r.family("ipam_allocations_gc_candidates")) == {(V4, "node-00000"): len(leaked)}
        assert sum(r.family("ipamgc_shard_candidates").values()) == len(leaked)
        assert sum(r.family("ipamgc_shard_due").values()) == len(leaked)
        assert reading.counters["validated"] >= len(leaked)

        clock.advance(61)
        assert validate_all() == len(leaked)  # promoted when due, confirmed, decided
        r.metrics.refresh()
        assert r.family("ipamgc_decisions_total") == {("pod-missing",): float(len(leaked))}
        batches = r.family("ipamgc_validation_batch_seconds_count")
        assert batches[()] >= 2
        buckets = {labels: v for (name, labels), v in r.samples().items() if name.endswith("_bucket")}
        assert buckets[(("le", "+Inf"),)] == batches[()]
        assert r.family("ipamgc_validated_total")[()] >= 2 * len(leaked)
        assert r.family("ipamgc_last_full_resync_timestamp_seconds") == {}  # none ran yet

        # The leader counts a release in Redis; the watcher maps its block to the pool.
        lead = LeaderMetrics()
        block = sim.cni.node_blocks("node-00000", 4)[0]
        for ip in leaked:
            lead.outcome(AuditRecord(Result.RELEASED, ip=ip, handle="h", block=block, node="node-00000"))
        lead.outcome(AuditRecord(Result.REFUSED_VALID, ip=leaked[0], block=block, node="node-00000"))
        lead.flush(client, KEYS)
        r.metrics.refresh()
        assert r.family("ipam_allocations_gc_reclamations") == {(V4, "node-00000"): float(len(leaked))}
        assert ("ipam_allocations_gc_reclamations", (("ippool", V4), ("node", "node-00000"))) in r.samples()


def test_reclamations_of_a_node_gone_for_good_are_pruned(
    server: SimApiServer, sim: SimCluster, client: redis.Redis, redis_url: str
) -> None:
    sim.bootstrap("15m")
    sim.populate(nodes=2, pods_per_node=1)
    client.hset(KEYS.reclaimed, mapping={"10.64.0.0/26|node-00000": 3, "10.64.0.64/26|node-gone": 2})
    with watcher_with_metrics(server, fast_settings(redis_url)) as r:
        wait_until(lambda: settled(r, server), timeout=15)
        r.metrics.prune_after = 0.0
        r.metrics.refresh()  # node-gone is neither a node nor in the mirror: first seen prunable …
        r.metrics.refresh()  # … and pruned once it has been for `prune_after`
        assert client.hgetall(KEYS.reclaimed) == {b"10.64.0.0/26|node-00000": b"3"}


def test_redis_memory_and_its_limit_come_from_info_memory(
    server: SimApiServer, sim: SimCluster, client: redis.Redis, redis_url: str
) -> None:
    """The refresh reads `INFO memory` once: `used_memory` grows with the mirror, `maxmemory` is Redis's
    configured bound (0 when unbounded), the two series IpamgcRedisMemoryHigh divides."""
    before = client.config_get("maxmemory")["maxmemory"]
    sim.bootstrap("1m")
    sim.populate(nodes=2, pods_per_node=3)
    try:
        client.config_set("maxmemory", 0)
        with watcher_with_metrics(server, fast_settings(redis_url)) as r:
            wait_until(lambda: settled(r, server), timeout=15)
            reading = r.metrics.refresh()
            assert r.family("ipamgc_redis_maxmemory_bytes") == {(): 0.0}
            used = r.family("ipamgc_redis_used_memory_bytes")[()]
            assert used == reading.used_memory > 0
            client.config_set("maxmemory", 512 * 1024 * 1024)
            r.metrics.refresh()
            assert r.family("ipamgc_redis_maxmemory_bytes") == {(): float(512 * 1024 * 1024)}
            ballast = "x" * 1_000_000
            client.set("ipamgc-test:ballast", ballast)  # ~1 MB more than the mirror
            r.metrics.refresh()
            assert r.family("ipamgc_redis_used_memory_bytes")[()] > used + 900_000
    finally:
        client.delete("ipamgc-test:ballast")
        client.config_set("maxmemory", before)
