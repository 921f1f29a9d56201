"""The shard job on records it cannot read (skipped, counted, never decided; a pod that may exist) and on its
timers: a pod that comes back, a timer for another sequence number, a node's new incarnation."""

from __future__ import annotations

import dataclasses

import redis

from producer.mirror import Mirror
from shared.clock import FakeClock
from shared.gcrecords import Candidate, encode_candidate
from shared.keys import Keys
from shared.records import encode_node
from shared.shard import shard_of
from tests.fixtures.redis import Cluster, decisions, dirty_ids
from tests.workers.shards.validate_helpers import GRACE, candidate, due, run, start


def test_malformed_records_are_skipped_and_counted_never_decided(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, clock: FakeClock
) -> None:
    cluster.builder.add_node("node-1")
    start(mirror, cluster)
    run(client, keys, clock)
    s = shard_of("node-1")
    truncated, wrong_version = "k8s-pod-network.x/10.244.0.9", "k8s-pod-network.y/10.244.0.10"
    good = encode_candidate(Candidate(0.0, 0))  # any valid msgpack record
    client.hset(keys.alloc(s), mapping={truncated: b"\x95\x01\xa6", wrong_version: b"\x95\x09" + good[2:]})
    client.sadd(keys.dirty(s), truncated, wrong_version)
    stats = run(client, keys, clock)
    assert stats.skipped_malformed == 2
    assert (stats.validated, stats.decisions) == (0, 0)
    assert decisions(client, keys) == []
    assert dirty_ids(client, keys) == set() and client.zcard(keys.inflight(s)) == 0


def test_unreadable_record_on_a_gone_node_keeps_its_tunnel_ip(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, clock: FakeClock
) -> None:
    cluster.builder.add_node("node-1")
    start(mirror, cluster)
    s = shard_of("node-1")
    bad = "k8s-pod-network.z/10.244.0.33"
    client.hset(keys.alloc(s), bad, b"\xc1")
    client.sadd(keys.nodeallocs(s, "node-1"), bad)
    cluster.builder.delete_node("node-1")
    mirror.delete_node("node-1")
    stats = run(client, keys, clock)
    assert stats.confirmed == 0 and decisions(client, keys) == []
    assert stats.skipped_malformed == 1


def test_unreadable_pod_record_means_the_pod_may_exist(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, clock: FakeClock
) -> None:
    cluster.builder.add_node("node-1")
    cluster.builder.add_pod("default", "web-0", "node-1")
    start(mirror, cluster)
    client.hset(keys.pods, "default/web-0", b"\x92\x07\x00")
    mirror.mark_all_dirty()
    stats = run(client, keys, clock)
    assert (stats.unknown_lookups, stats.candidates, stats.confirmed) == (1, 0, 0)


def test_a_pod_that_comes_back_clears_the_candidate(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, clock: FakeClock
) -> None:
    cluster.builder.add_node("node-1")
    handle, ips = cluster.builder.add_pod("default", "web-0", "node-1")
    pod = cluster.pod("default", "web-0")
    start(mirror, cluster)
    mirror.delete_pod("default", "web-0")  # e.g. an informer glitch
    run(client, keys, clock)
    alloc_id = f"{handle}/{ips[0]}"
    assert candidate(client, keys, "node-1", alloc_id) is not None
    clock.advance(10)
    mirror.apply_pod(pod)
    run(client, keys, clock)
    assert candidate(client, keys, "node-1", alloc_id) is None
    assert due(client, keys, "node-1", alloc_id) is None


def test_a_timer_for_another_sequence_number_restarts(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, clock: FakeClock
) -> None:
    cluster.builder.add_node("node-1")
    handle, ips = cluster.builder.add_pod("default", "web-0", "node-1")
    start(mirror, cluster)
    run(client, keys, clock)
    alloc_id = f"{handle}/{ips[0]}"
    client.hset(
        keys.cand(shard_of("node-1")), alloc_id, encode_candidate(Candidate(clock.now() - 10 * GRACE, 1))
    )
    mirror.delete_pod("default", "web-0")
    stats = run(client, keys, clock)
    assert (stats.candidates, stats.confirmed) == (1, 0)
    c = candidate(client, keys, "node-1", alloc_id)
    assert c is not None and c.first_seen == clock.now()


def test_a_new_node_incarnation_revalidates_its_tunnel(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, clock: FakeClock
) -> None:
    cluster.builder.add_node("node-1")
    start(mirror, cluster)
    run(client, keys, clock)
    node = cluster.node("node-1")
    # The watcher saw another incarnation of node-1 last (it keeps node records in its memory now).
    mirror.apply_node(dataclasses.replace(node, uid="another"))
    run(client, keys, clock)
    assert client.hget(keys.nodes, "node-1") == encode_node(dataclasses.replace(node, uid="another"))
    assert mirror.apply_node(node) == 1
