"""The watcher's backstop (`producer/backstop.py`) catches, within one pass, what the full resync existed
to catch: a dirty mark lost (or never made: a bug in dirty tracking) is made again for exactly the
allocations the watcher's memory cannot show valid, and a mirror record changed behind the watcher's back
(a Redis that failed over to a replica missing the last writes, an operator's `redis-cli`) is found and
rewritten from the cluster.  No workers run here: what is asserted is what the workers are handed."""

from __future__ import annotations

import redis

from lab.apiserver.apiserver import SimApiServer
from lab.cluster.cluster import SimCluster
from producer.backstop import AUDIT_SLICES
from producer.watcher import Watcher
from shared.blockrecords import decode_block
from tests.fixtures.stack import (
    KEYS,
    allocation_ids,
    caught_up,
    clear_dirty,
    dirty_ids,
    fast_settings,
    pod_mirrored,
    running_watcher,
)
from tests.polling import wait_until


def _synced(w: Watcher, server: SimApiServer) -> None:
    wait_until(lambda: w.synced.is_set() and caught_up(w, server), timeout=20)


def _pass(w: Watcher) -> None:
    before = w.stats.get("resyncs")
    w.request_resync()
    wait_until(lambda: w.stats.get("resyncs") > before, timeout=10)


def test_a_lost_dirty_mark_is_made_again_for_exactly_what_may_be_leaked(
    server: SimApiServer, sim: SimCluster, client: redis.Redis, redis_url: str
) -> None:
    sim.bootstrap("1h")
    sim.populate(nodes=4, pods_per_node=4)
    sim.stale_node_attribute("ns-x", "stale", node="node-00000", attr_node="node-00001")  # valid: kept
    with running_watcher(server, fast_settings(redis_url)) as rw:
        w = rw.watcher
        _synced(w, server)
        clear_dirty(client)  # as if the workers had validated everything
        _pass(w)
        assert dirty_ids(client) == set()  # nothing may be leaked: a quiet pass hands the workers nothing

        sim.leak_pod_deleted_without_cni_del("ns-0", "pod-0000000")
        sim.leak_node_deleted("node-00003")  # its pods go too: their IPs and the node's tunnel IP
        sim.leak_ip_changed("ns-5", "pod-0000005")
        sim.leak_terminal_pod("ns-9", "pod-0000009")
        wait_until(lambda: caught_up(w, server), timeout=10)
        leaked = allocation_ids(sim, ips=sim.truth.leaked_ips())
        assert leaked and leaked <= dirty_ids(client)
        clear_dirty(client)  # the marks lost (a failover, a worker bug): nothing would re-validate them

        _pass(w)
        assert dirty_ids(client) == leaked
        assert w.stats.get("backstop_walked") >= 2 * 16


def test_a_record_changed_behind_the_watchers_back_is_rewritten_from_the_cluster(
    server: SimApiServer, sim: SimCluster, client: redis.Redis, redis_url: str
) -> None:
    sim.bootstrap("1h")
    sim.populate(nodes=3, pods_per_node=3)
    with running_watcher(server, fast_settings(redis_url)) as rw:
        w = rw.watcher
        _synced(w, server)
        # A pod deleted without a CNI DEL; then Redis loses the watcher's HDEL of its record (a failover
        # to a replica that had not received it): the mirror shows a live pod holding a leaked IP.
        gone = client.hget(KEYS.pods, "ns-0/pod-0000000")
        assert isinstance(gone, bytes)
        sim.leak_pod_deleted_without_cni_del("ns-0", "pod-0000000")
        wait_until(
            lambda: caught_up(w, server) and not pod_mirrored(client, "ns-0", "pod-0000000"), timeout=10
        )
        client.hset(KEYS.pods, "ns-0/pod-0000000", gone)
        # A live pod's record lost; a node's record lost; a block's record rolled back to an older one.
        client.hdel(KEYS.pods, "ns-1/pod-0000001")
        node_record = client.hget(KEYS.nodes, "node-00001")
        client.hdel(KEYS.nodes, "node-00001")
        cidr = sorted(k.decode() for k in client.hkeys(KEYS.blocks))[0]
        older = client.hget(KEYS.blocks, cidr)
        sim.create_pod("ns-z", "late", node=_host(client, cidr))
        wait_until(lambda: caught_up(w, server) and client.hget(KEYS.blocks, cidr) != older, timeout=10)
        current = client.hget(KEYS.blocks, cidr)
        client.hset(KEYS.blocks, cidr, older)  # type: ignore[arg-type]
        clear_dirty(client)

        _pass(w)

        # A record removed (the hash is shorter than what the watcher holds): found by this pass.
        wait_until(lambda: client.hget(KEYS.nodes, "node-00001") == node_record, timeout=15)
        # The pods' length is right (one record too many, one missing) and the block changed in place:
        # found by the pass whose slice holds them (`AUDIT_SLICES` passes read every hash).
        leaked = allocation_ids(sim, ips=sim.truth.leaked_ips())

        def repaired() -> bool:
            return (
                not pod_mirrored(client, "ns-0", "pod-0000000")
                and pod_mirrored(client, "ns-1", "pod-0000001")
                and client.hget(KEYS.blocks, cidr) == current
                and leaked <= dirty_ids(client)
            )

        for _ in range(AUDIT_SLICES):
            if w.stats.get("backstop_repairs", "blocks") and w.stats.get("backstop_repairs", "pods"):
                break
            wait_until(lambda: caught_up(w, server), timeout=10)
            _pass(w)
        wait_until(repaired, timeout=15)
        assert w.stats.get("backstop_repairs", "pods") == 2
        assert w.stats.get("backstop_repairs", "nodes") == 1
        assert w.stats.get("backstop_repairs", "blocks") == 1
        # Repaired, the next pass finds nothing to repair.
        wait_until(lambda: caught_up(w, server), timeout=10)
        _pass(w)
        assert w.stats.get("backstop_repairs", "pods") == 2


def _host(client: redis.Redis, cidr: str) -> str:
    data = client.hget(KEYS.blocks, cidr)
    assert isinstance(data, bytes)
    host = decode_block(data).host
    assert host is not None
    return host


def test_a_redis_that_lost_the_last_writes_is_noticed_and_repaired_without_waiting_for_the_period(
    server: SimApiServer, sim: SimCluster, client: redis.Redis, redis_url: str
) -> None:
    """A failover to a replica that had not received the last writes, or a restart from an older file:
    Redis goes back in time.  The watcher's write generation (`producer/generation.py`) is then lower than
    the one it wrote; the next kick notices and runs the backstop at once."""
    sim.bootstrap("1h")
    sim.populate(nodes=3, pods_per_node=3)
    with running_watcher(server, fast_settings(redis_url)) as rw:  # the period: an hour
        w = rw.watcher
        _synced(w, server)
        clear_dirty(client)
        older = _snapshot(client)
        sim.leak_pod_deleted_without_cni_del("ns-0", "pod-0000000")
        wait_until(
            lambda: caught_up(w, server) and not pod_mirrored(client, "ns-0", "pod-0000000"), timeout=10
        )
        _restore(client, older)  # the writes of that delete are lost; the pod looks alive again
        assert pod_mirrored(client, "ns-0", "pod-0000000") and not dirty_ids(client)

        leaked = allocation_ids(sim, ips=sim.truth.leaked_ips())
        wait_until(
            lambda: (
                w.stats.get("redis_lost_writes") >= 1
                and not pod_mirrored(client, "ns-0", "pod-0000000")
                and leaked <= dirty_ids(client)
            ),
            timeout=15,
        )
        assert w.stats.get("resyncs") >= 1


def _snapshot(client: redis.Redis) -> dict[bytes, bytes]:
    return {key: client.dump(key) for key in client.scan_iter(count=1000)}  # type: ignore[misc]


def _restore(client: redis.Redis, snapshot: dict[bytes, bytes]) -> None:
    pipe = client.pipeline(transaction=True)
    pipe.flushdb()
    for key, value in snapshot.items():
        if value is not None:
            pipe.restore(key, 0, value, replace=True)
    pipe.execute()
