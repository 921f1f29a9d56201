"""The mirror on relists: the deletes a missed watch would have emitted, a block that disappeared, and a
soft-deleted block taken as a delete."""

from __future__ import annotations

import redis

from producer.mirror import Mirror
from producer.relist import Kind
from shared.keys import Keys
from shared.model import IPAMBlock
from shared.shard import shard_of
from tests.fixtures.redis import Cluster, dirty_ids
from tests.handles import handle_fields
from tests.producer.mirror_helpers import LB_HANDLE, build, load, node_ids, settle


def test_relist_emits_the_deletes_a_missed_watch_would_have(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster
) -> None:
    ids = build(cluster)
    load(mirror, cluster)
    settle(client, keys)
    # While the watch was down: web-0 deleted without CNI DEL, node-2 deleted, web-1's IPs released.
    cluster.builder.delete_pod("default", "web-0", cni_del=False)
    cluster.builder.delete_node("node-2")
    cluster.builder.delete_pod("default", "web-1", cni_del=True)
    mirror.relist(Kind.PODS, cluster.pods())
    assert dirty_ids(client, keys) == node_ids(ids, "web-0", "web-1")
    settle(client, keys)
    mirror.relist(Kind.NODES, cluster.nodes())
    assert dirty_ids(client, keys) == node_ids(ids, "db-0", "tunnel-2")
    assert client.hkeys(keys.nodes) == [b"node-1"]
    settle(client, keys)
    mirror.relist(Kind.BLOCKS, cluster.blocks())
    assert dirty_ids(client, keys) == set(ids["web-1"])


def test_relist_drops_a_block_that_disappeared(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster
) -> None:
    ids = build(cluster)
    load(mirror, cluster)
    settle(client, keys)
    v6 = [b for b in cluster.blocks() if b.cidr.version == 6]
    survivors: list[IPAMBlock] = [b for b in cluster.blocks() if b.cidr.version == 4]
    mirror.relist(Kind.BLOCKS, survivors)
    lost = {a.id for b in v6 for a in b.iter_allocations()}
    assert lost == {ids["web-1"][1]}
    assert dirty_ids(client, keys) == lost
    assert not client.hexists(keys.blocks, v6[0].cidr_str)
    assert not client.sismember(keys.nodeblocks(shard_of("node-1"), "node-1"), v6[0].cidr_str)


def test_soft_deleted_block_is_a_delete(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster
) -> None:
    ids = build(cluster)
    load(mirror, cluster)
    settle(client, keys)
    cidr = cluster.builder.ipam.node_blocks("node-2", 4)[0]
    cluster.builder.ipam.blocks[cidr]["spec"]["deleted"] = True
    mirror.apply_block(cluster.block(cidr))
    assert dirty_ids(client, keys) == node_ids(ids, "db-0", "tunnel-2")
    assert not handle_fields(client, keys, LB_HANDLE)
