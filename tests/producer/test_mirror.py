"""The mirror dirties exactly the allocations an event can have changed, and keeps its indexes exact: the
initial load, and block events (new, changed, moved and vanished allocations).  Pods, nodes and the
config: test_mirror_pods_nodes.py; relists: test_mirror_relist.py; arming shards: test_mirror_kick.py."""

from __future__ import annotations

import redis

from producer.mirror import Mirror
from shared.gcrecords import Candidate, Decided, encode_candidate, encode_decided
from shared.keys import Keys, alloc_id_of, handle_field
from shared.records import decode_allocation
from shared.shard import DEFAULT_SHARDS, shard_of
from tests.fixtures.redis import Cluster, dirty_ids
from tests.handles import handle_fields
from tests.producer.mirror_helpers import LB_HANDLE, build, load, node_ids, podallocs, settle


def test_initial_load_dirties_every_allocation_with_a_node(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, enqueued: list[int]
) -> None:
    ids = build(cluster)
    load(mirror, cluster)
    assert dirty_ids(client, keys) == node_ids(ids, "web-0", "web-1", "db-0", "tunnel-1", "tunnel-2")
    shards = {shard_of("node-1"), shard_of("node-2")}
    assert sorted(enqueued) == sorted(shards)  # one job per shard, however many ids
    # Per shard: the records, the node index; globally: handle and pod indexes.
    s1 = shard_of("node-1")
    rec = client.hget(keys.alloc(s1), ids["web-0"][0])
    assert rec is not None and decode_allocation(ids["web-0"][0], rec).node == "node-1"
    assert {m.decode() for m in client.smembers(keys.nodeallocs(s1, "node-1"))} == node_ids(
        ids, "web-0", "web-1", "tunnel-1"
    )
    handle = ids["web-1"][0].rsplit("/", 1)[0]
    assert handle_fields(client, keys, handle) == {
        i.rsplit("/", 1)[1].encode(): b"node-1" for i in ids["web-1"]
    }
    assert podallocs(mirror, "default/web-1") == dict.fromkeys(ids["web-1"], str(s1))


def test_handle_fields_invert_to_allocation_ids() -> None:
    assert handle_field("k8s-pod-network.abc/10.0.0.1") == "10.0.0.1"
    assert alloc_id_of("k8s-pod-network.abc", "10.0.0.1") == "k8s-pod-network.abc/10.0.0.1"
    odd = "k8s-pod-network.abc\r/fd00::1"  # a handle Calico sanitises
    assert handle_field(odd) == odd
    assert alloc_id_of("k8s-pod-network.abc", handle_field(odd)) == odd


def test_allocation_without_node_is_indexed_by_handle_but_never_dirtied(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster
) -> None:
    ids = build(cluster)
    load(mirror, cluster)
    lb = ids["lb"][0]
    assert lb not in dirty_ids(client, keys)
    assert handle_fields(client, keys, LB_HANDLE) == {handle_field(lb).encode(): b""}
    assert all(not client.hexists(keys.alloc(s), lb) for s in range(DEFAULT_SHARDS))


def test_identical_block_event_dirties_nothing(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, enqueued: list[int]
) -> None:
    build(cluster)
    load(mirror, cluster)
    settle(client, keys)
    enqueued.clear()
    assert mirror.apply_blocks(cluster.blocks()) == 0
    assert dirty_ids(client, keys) == set()
    assert enqueued == []


def test_repeated_dirty_ids_collapse_into_one_job(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, enqueued: list[int]
) -> None:
    ids = build(cluster)
    load(mirror, cluster)
    settle(client, keys)
    enqueued.clear()
    raw = cluster.raw_pod("default", "web-0")
    raw["status"]["phase"] = "Succeeded"
    assert mirror.apply_pod(cluster.pod("default", "web-0")) == 1
    mirror.delete_pod("default", "web-0")  # dirties the same id again: it collapses
    assert dirty_ids(client, keys) == set(ids["web-0"])
    assert enqueued == [shard_of("node-1")]  # the second event found the job already queued


def test_new_allocation_dirties_only_itself(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster
) -> None:
    build(cluster)
    load(mirror, cluster)
    settle(client, keys)
    handle, ips = cluster.builder.add_pod("default", "web-2", "node-1")
    assert mirror.apply_block(cluster.block_of(ips[0])) == 1
    assert dirty_ids(client, keys) == {f"{handle}/{ips[0]}"}


def test_changed_sequence_number_refreshes_the_record_and_resets_its_timers(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster
) -> None:
    ids = build(cluster)
    load(mirror, cluster)
    settle(client, keys)
    target = ids["web-0"][0]
    s = shard_of("node-1")
    client.hset(keys.cand(s), target, encode_candidate(Candidate(1.0, 7)))
    client.zadd(keys.due(s), {target: 901.0})
    client.hset(keys.decided(s), target, encode_decided(Decided(7, 2.0)))
    ip = target.rsplit("/", 1)[1]
    block = cluster.block_of(ip)
    ordinal = next(a.ordinal for a in block.iter_allocations() if a.ip == ip)
    raw = cluster.builder.ipam.blocks[block.cidr_str]
    raw["spec"]["sequenceNumberForAllocation"][str(ordinal)] += 1000  # #12839: a re-read sequence number
    mirror.apply_block(cluster.block_of(ip))
    assert dirty_ids(client, keys) == {target}
    rec = client.hget(keys.alloc(s), target)
    assert rec is not None
    assert (
        decode_allocation(target, rec).sequence_number
        == raw["spec"]["sequenceNumberForAllocation"][str(ordinal)]
    )
    assert not client.hexists(keys.cand(s), target)
    assert client.zscore(keys.due(s), target) is None
    assert not client.hexists(keys.decided(s), target)


def test_changed_node_attribute_moves_the_allocation_to_its_new_shard(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster
) -> None:
    ids = build(cluster)
    load(mirror, cluster)
    settle(client, keys)
    target = ids["web-0"][0]
    ip = target.rsplit("/", 1)[1]
    raw = cluster.builder.ipam.blocks[cluster.builder.ipam.block_of(ip)]
    handle = target.rsplit("/", 1)[0]
    index = next(i for i, a in enumerate(raw["spec"]["attributes"]) if a["handle_id"] == handle)
    raw["spec"]["attributes"][index]["secondary"]["node"] = "node-2"
    mirror.apply_block(cluster.block_of(ip))
    old, new = shard_of("node-1"), shard_of("node-2")
    assert {m.decode() for m in client.smembers(keys.dirty(new))} == {target}
    assert not client.sismember(keys.nodeallocs(old, "node-1"), target)
    assert client.sismember(keys.nodeallocs(new, "node-2"), target)
    assert handle_fields(client, keys, handle).get(handle_field(target).encode()) == b"node-2"
    assert podallocs(mirror, "default/web-0") == {target: str(new)}
    if old != new:
        assert not client.hexists(keys.alloc(old), target)


def test_vanished_allocations_are_dirtied_and_removed_everywhere(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster
) -> None:
    ids = build(cluster)
    load(mirror, cluster)
    settle(client, keys)
    s = shard_of("node-1")
    for i in ids["web-1"]:
        client.hset(keys.cand(s), i, encode_candidate(Candidate(1.0, 1)))
    cluster.builder.delete_pod("default", "web-1", cni_del=True)  # CNI DEL releases both IPs
    mirror.apply_blocks(cluster.blocks())
    gone = set(ids["web-1"])
    assert dirty_ids(client, keys) == gone
    handle = ids["web-1"][0].rsplit("/", 1)[0]
    assert not handle_fields(client, keys, handle)
    assert podallocs(mirror, "default/web-1") == {}
    assert not any(client.hexists(keys.alloc(s), i) for i in gone)
    assert not any(client.sismember(keys.nodeallocs(s, "node-1"), i) for i in gone)
    assert not any(client.hexists(keys.cand(s), i) for i in gone)


def test_vanished_allocation_on_a_gone_node_dirties_what_is_left_on_it(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster
) -> None:
    ids = build(cluster)
    load(mirror, cluster)
    mirror.delete_node("node-1")
    settle(client, keys)
    cluster.builder.ipam.release_handle(ids["web-0"][0].rsplit("/", 1)[0])
    mirror.apply_blocks(cluster.blocks())
    # web-0's IP vanished; the tunnel (and web-1) must be re-judged: the node may now be drained.
    assert dirty_ids(client, keys) == node_ids(ids, "web-0", "web-1", "tunnel-1")
