"""The mirror dirties exactly the allocations a pod, node or config event can have changed: pods deleted,
changed or finished, nodes deleted or added, the config changed; nothing for an unchanged pod."""

from __future__ import annotations

import redis

from producer.mirror import Mirror
from producer.relist import Kind
from shared.keys import Keys
from shared.shard import shard_of
from tests.fixtures.redis import Cluster, dirty_ids
from tests.producer.mirror_helpers import build, load, node_ids, settle


def test_pod_delete_dirties_its_allocations_once(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster
) -> None:
    ids = build(cluster)
    load(mirror, cluster)
    settle(client, keys)
    mirror.delete_pod("default", "web-1")
    assert dirty_ids(client, keys) == set(ids["web-1"])  # both families of the dual-stack pod
    assert not client.hexists(keys.pods, "default/web-1")
    settle(client, keys)
    assert mirror.delete_pod("default", "web-1") == 0  # a repeated delete is not new work
    assert dirty_ids(client, keys) == set()


def test_pod_ip_change_dirties_its_allocations(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster
) -> None:
    ids = build(cluster)
    load(mirror, cluster)
    settle(client, keys)
    cluster.builder.set_pod_ips("default", "web-0", ["10.244.0.200"])
    mirror.apply_pod(cluster.pod("default", "web-0"))
    assert dirty_ids(client, keys) == set(ids["web-0"])


def test_pod_phase_succeeded_dirties_its_allocations(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster
) -> None:
    ids = build(cluster)
    load(mirror, cluster)
    settle(client, keys)
    cluster.raw_pod("default", "db-0")["status"]["phase"] = "Succeeded"
    mirror.apply_pod(cluster.pod("default", "db-0"))
    assert dirty_ids(client, keys) == set(ids["db-0"])


def test_unchanged_pod_dirties_nothing(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster
) -> None:
    build(cluster)
    load(mirror, cluster)
    settle(client, keys)
    assert mirror.apply_pods(cluster.pods()) == 0
    assert dirty_ids(client, keys) == set()


def test_node_delete_dirties_all_its_allocations_and_its_blocks(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster
) -> None:
    ids = build(cluster)
    load(mirror, cluster)
    settle(client, keys)
    mirror.delete_node("node-1")
    assert dirty_ids(client, keys) == node_ids(ids, "web-0", "web-1", "tunnel-1")
    s = shard_of("node-1")
    assert {c.decode() for c in client.smembers(keys.dirtyblocks(s))} == set(
        cluster.builder.ipam.node_blocks("node-1")
    )
    settle(client, keys)
    assert mirror.delete_node("node-1") == 0
    assert dirty_ids(client, keys) == set()


def test_node_add_dirties_its_allocations(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster
) -> None:
    ids = build(cluster)
    mirror.relist(Kind.PODS, cluster.pods())
    mirror.relist(Kind.BLOCKS, cluster.blocks())
    mirror.apply_node(cluster.node("node-2"))
    settle(client, keys)
    mirror.apply_node(cluster.node("node-1"))
    assert dirty_ids(client, keys) == node_ids(ids, "web-0", "web-1", "tunnel-1")
    settle(client, keys)
    assert mirror.apply_node(cluster.node("node-1")) == 0


def test_config_change_dirties_everything(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster
) -> None:
    ids = build(cluster)
    assert mirror.set_config(900.0, True) is False  # first configuration: nothing to redo
    load(mirror, cluster)
    settle(client, keys)
    assert mirror.set_config(900.0, True) is False
    assert dirty_ids(client, keys) == set()
    assert mirror.set_config(60.0, True) is True
    assert dirty_ids(client, keys) == node_ids(ids, "web-0", "web-1", "db-0", "tunnel-1", "tunnel-2")
    settle(client, keys)
    assert mirror.set_config(None, True) is True
    assert client.hget(keys.state, "leak_grace_period") is None
    assert dirty_ids(client, keys) == node_ids(ids, "web-0", "web-1", "db-0", "tunnel-1", "tunnel-2")
