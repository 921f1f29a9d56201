"""The mirror dirties exactly the allocations an event can have changed, and keeps its indexes exact."""

from __future__ import annotations

import pytest
import redis

from producer.mirror import Mirror
from producer.relist import Kind
from shared.clock import FakeClock
from shared.gcrecords import Candidate, Decided, encode_candidate, encode_decided
from shared.keys import Keys, alloc_id_of, handle_field
from shared.model import IPAMBlock
from shared.records import decode_allocation
from shared.shard import DEFAULT_SHARDS, shard_of
from tests.fixtures.redis import Cluster, dirty_ids
from tests.handles import handle_fields

LB_HANDLE = "lb-5XbT1N8cQm"


def build(cluster: Cluster) -> dict[str, list[str]]:
    """node-1: tunnel, web-0, web-1 (dual-stack); node-2: tunnel, db-0; a LoadBalancer IP with no node."""
    b = cluster.builder
    b.add_node("node-1")
    b.add_node("node-2")
    out = {}
    for ns, name, node, dual in [
        ("default", "web-0", "node-1", False),
        ("default", "web-1", "node-1", True),
        ("default", "db-0", "node-2", False),
    ]:
        handle, ips = b.add_pod(ns, name, node, dual_stack=dual)
        out[name] = [f"{handle}/{ip}" for ip in ips]
    cidr = b.ipam.node_blocks("node-2", 4)[0]
    lb_ip = b.ipam.assign_in_block(cidr, LB_HANDLE, {"namespace": "default", "service": "front"})
    out["lb"] = [f"{LB_HANDLE}/{lb_ip}"]
    out["tunnel-1"] = [f"vxlan-tunnel-addr-node-1/{_tunnel_ip(cluster, 'node-1')}"]
    out["tunnel-2"] = [f"vxlan-tunnel-addr-node-2/{_tunnel_ip(cluster, 'node-2')}"]
    return out


def _tunnel_ip(cluster: Cluster, node: str) -> str:
    for block in cluster.blocks():
        for a in block.iter_allocations():
            if a.handle == f"vxlan-tunnel-addr-{node}":
                return a.ip
    raise AssertionError(node)


def load(mirror: Mirror, cluster: Cluster) -> None:
    mirror.relist(Kind.NODES, cluster.nodes())
    mirror.relist(Kind.PODS, cluster.pods())
    mirror.relist(Kind.BLOCKS, cluster.blocks())


def settle(client: redis.Redis, keys: Keys) -> None:
    """As if every shard job had run: nothing dirty, nothing queued."""
    for s in range(DEFAULT_SHARDS):
        client.delete(keys.dirty(s), keys.queued(s))


def podallocs(mirror: Mirror, pod: str) -> dict[str, str]:
    """The watcher's pod → allocations index (in its memory since it stopped living in Redis)."""
    ns, name = pod.split("/", 1)
    return {i: str(s) for i, s in mirror.pod_allocations(ns, name).items()}


def node_ids(ids: dict[str, list[str]], *names: str) -> set[str]:
    return {i for n in names for i in ids[n]}


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


def test_kick_enqueues_shards_with_due_candidates_or_expired_leases(
    client: redis.Redis, keys: Keys, mirror: Mirror, clock: FakeClock, enqueued: list[int]
) -> None:
    client.zadd(keys.due(1), {"h/10.0.0.1": clock.now() + 10})
    client.zadd(keys.inflight(2), {"h/10.0.0.2": clock.now() - 1})
    assert mirror.kick() == [2]
    clock.advance(3)
    assert mirror.kick() == []  # 2 is queued, its lease expired only 4 s ago; 1 is not due yet
    clock.advance(8)
    # 1 is due; 2's job still holds a lease expired 12 s ago: its worker died, the shard is re-armed.
    assert mirror.kick() == [1, 2]
    assert enqueued == [2, 1, 2]


def test_failed_enqueue_drops_the_queued_flag(client: redis.Redis, keys: Keys, cluster: Cluster) -> None:
    def broken(shard: int) -> None:
        raise ConnectionError("queue down")

    mirror = Mirror(client, keys, enqueue=broken)
    build(cluster)
    with pytest.raises(ConnectionError):
        mirror.apply_blocks(cluster.blocks())
    assert all(not client.exists(keys.queued(s)) for s in range(DEFAULT_SHARDS))
    assert dirty_ids(client, keys)  # the work itself is not lost: the next event or kick enqueues it


def test_no_shard_is_armed_while_the_gate_the_mirror_wrote_is_shut(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, enqueued: list[int]
) -> None:
    """While listing (not synced) or while the datastore is not ready, a batch only adds dirty ids: a
    job would find the gate shut.  Opening the gate kicks every shard with work."""
    ids = build(cluster)
    mirror.set_config(300.0, True)
    mirror.mark_synced(False)
    load(mirror, cluster)
    shards = {shard_of("node-1"), shard_of("node-2")}
    assert enqueued == [] and mirror.kick() == []
    assert not any(client.exists(keys.queued(s)) for s in range(DEFAULT_SHARDS))
    assert not client.exists(keys.pulses)
    assert set(ids["web-0"]) <= dirty_ids(client, keys)
    mirror.mark_synced(True)
    assert sorted(enqueued) == sorted(shards)
    settle(client, keys)
    enqueued.clear()
    mirror.set_config(300.0, False)
    cluster.builder.delete_pod("default", "web-0", cni_del=False)
    mirror.delete_pod("default", "web-0")
    assert enqueued == [] and mirror.kick() == []
    assert set(ids["web-0"]) <= dirty_ids(client, keys)
    mirror.set_config(300.0, True)
    assert shard_of("node-1") in enqueued
