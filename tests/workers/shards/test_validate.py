"""The shard job decides exactly as Calico's GC would, on scenarios built with `ClusterBuilder`: leaks
confirmed after the grace period, deleted nodes, dual stack, terminal pods, stale node attributes, no grace
period, and nothing before the datastore is ready and the mirror synced."""

from __future__ import annotations

import pytest
import redis

from producer.mirror import Mirror
from producer.relist import Kind
from shared.clock import FakeClock
from shared.gcrecords import Candidate
from shared.keys import REDECIDE_AFTER_SECONDS, Keys, alloc_id_of
from shared.shard import shard_of
from tests.fixtures.redis import Cluster, decisions, dirty_ids
from tests.handles import handle_fields
from tests.workers.shards.validate_helpers import GRACE, candidate, due, run, start
from workers.shards.writes import DUE_EPSILON_SECONDS


def test_pod_deleted_without_cni_del_is_confirmed_only_after_the_grace_period(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, clock: FakeClock, enqueued: list[int]
) -> None:
    cluster.builder.add_node("node-1")
    handle, ips = cluster.builder.add_pod("default", "web-0", "node-1")
    start(mirror, cluster)
    first = run(client, keys, clock)
    assert (first.validated, first.candidates, first.decisions) == (2, 0, 0)

    cluster.builder.delete_pod("default", "web-0", cni_del=False)
    mirror.delete_pod("default", "web-0")
    leaked = f"{handle}/{ips[0]}"
    t0 = clock.now()
    stats = run(client, keys, clock)
    assert (stats.validated, stats.candidates, stats.confirmed) == (1, 1, 0)
    assert candidate(client, keys, "node-1", leaked) == Candidate(t0, candidate_seq(client, keys, leaked))
    assert due(client, keys, "node-1", leaked) == pytest.approx(t0 + GRACE + DUE_EPSILON_SECONDS)

    clock.advance(GRACE)  # exactly the grace period: not yet (confirmation is strictly after)
    assert mirror.kick() == []
    assert run(client, keys, clock).confirmed == 0
    assert decisions(client, keys) == []

    clock.advance(1.0)  # no new event: the due time alone brings it back
    enqueued.clear()
    assert mirror.kick() == [shard_of("node-1")]
    stats = run(client, keys, clock)
    assert (stats.promoted, stats.confirmed, stats.decisions) == (1, 1, 1)
    [d] = decisions(client, keys)
    assert (d.alloc_id, d.ip, d.handle, d.node, d.reason, d.type) == (
        leaked,
        ips[0],
        handle,
        "node-1",
        "pod-missing",
        "pod",
    )
    assert d.node_exists is True
    assert d.pod == {"lookup": "missing"}
    assert (d.first_seen, d.decided_at) == (t0, clock.now())
    assert d.block == cluster.builder.ipam.block_of(ips[0])
    assert d.block_resource_version != ""
    assert d.sequence_number == candidate_seq(client, keys, leaked)
    assert due(client, keys, "node-1", leaked) is None

    # Re-validated again (a resync): the same leak is not decided twice...
    mirror.mark_all_dirty()
    assert run(client, keys, clock).decisions == 0
    # ...until the decision is old enough to have been lost.
    clock.advance(REDECIDE_AFTER_SECONDS)
    mirror.mark_all_dirty()
    assert run(client, keys, clock).decisions == 1


def candidate_seq(client: redis.Redis, keys: Keys, alloc_id: str) -> int:
    from shared.records import decode_allocation

    raw = client.hget(keys.alloc(shard_of("node-1")), alloc_id)
    assert raw is not None
    return decode_allocation(alloc_id, raw).sequence_number


def test_deleted_node_releases_pod_ips_and_then_its_tunnel_ip(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, clock: FakeClock
) -> None:
    b = cluster.builder
    b.add_node("node-1")
    b.add_node("node-2")
    h1, ip1 = b.add_pod("default", "a", "node-2")
    h2, ip2 = b.add_pod("default", "b", "node-2")
    b.add_pod("default", "c", "node-1")
    start(mirror, cluster)
    run(client, keys, clock)
    tunnel = next(
        a.id for blk in cluster.blocks() for a in blk.iter_allocations() if a.handle.endswith("node-2")
    )

    b.delete_node("node-2")  # its pods still exist: nothing may go yet
    mirror.delete_node("node-2")
    stats = run(client, keys, clock)
    assert (stats.validated, stats.confirmed, stats.decisions) == (3, 0, 0)

    for name in ("a", "b"):
        b.pods.pop(("default", name))
        mirror.delete_pod("default", name)
    stats = run(client, keys, clock)
    assert stats.confirmed == 3
    got = {d.alloc_id: d for d in decisions(client, keys)}
    assert set(got) == {f"{h1}/{ip1[0]}", f"{h2}/{ip2[0]}", tunnel}
    assert got[tunnel].reason == "node-missing" and got[tunnel].type == "tunnel"
    assert all(d.node_exists is False for d in got.values())
    assert got[f"{h1}/{ip1[0]}"].reason == "pod-missing"


def test_dual_stack_pod_reporting_only_ipv4_makes_its_ipv6_a_candidate_carrying_the_handle(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, clock: FakeClock
) -> None:
    b = cluster.builder
    b.add_node("node-1")
    handle, ips = b.add_pod("default", "web-0", "node-1", dual_stack=True)
    b.set_pod_ips("default", "web-0", [ips[0]])
    start(mirror, cluster)
    stats = run(client, keys, clock)
    v4, v6 = (f"{handle}/{ip}" for ip in ips)
    assert stats.candidates == 1
    assert candidate(client, keys, "node-1", v6) is not None
    assert candidate(client, keys, "node-1", v4) is None
    clock.advance(GRACE + 1)
    run(client, keys, clock)
    [d] = decisions(client, keys)
    assert (d.alloc_id, d.handle, d.reason) == (v6, handle, "pod-ip-mismatch")
    # The leader needs the whole handle to enforce all-or-none: the valid IPv4 is in the index.
    index = {alloc_id_of(handle, f.decode()): n for f, n in handle_fields(client, keys, handle).items()}
    assert index == {v4: b"node-1", v6: b"node-1"}


def test_terminal_pod_ip_is_a_candidate_then_confirmed(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, clock: FakeClock
) -> None:
    cluster.builder.add_node("node-1")
    handle, ips = cluster.builder.add_pod("default", "job-0", "node-1", phase="Succeeded")
    start(mirror, cluster)
    assert run(client, keys, clock).candidates == 1
    clock.advance(GRACE + 1)
    run(client, keys, clock)
    [d] = decisions(client, keys)
    assert (d.alloc_id, d.reason) == (f"{handle}/{ips[0]}", "pod-terminated")
    assert d.pod["lookup"] == "found" and d.pod["phase"] == "Succeeded"


def test_stale_node_attribute_is_valid(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, clock: FakeClock
) -> None:
    b = cluster.builder
    b.add_node("node-1")
    b.add_node("node-2")
    handle, ips = b.add_pod("default", "web-0", "node-1")
    cluster.raw_pod("default", "web-0")["spec"]["nodeName"] = "node-2"  # #12257
    start(mirror, cluster)
    stats = run(client, keys, clock)
    assert (stats.candidates, stats.confirmed) == (0, 0)
    assert candidate(client, keys, "node-1", f"{handle}/{ips[0]}") is None


def test_unset_grace_period_makes_no_candidate(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, clock: FakeClock
) -> None:
    cluster.builder.add_node("node-1")
    handle, ips = cluster.builder.add_pod("default", "web-0", "node-1")
    start(mirror, cluster, grace=None)
    cluster.builder.delete_pod("default", "web-0", cni_del=False)
    mirror.delete_pod("default", "web-0")
    stats = run(client, keys, clock)
    assert (stats.validated, stats.candidates, stats.confirmed) == (2, 0, 0)
    assert candidate(client, keys, "node-1", f"{handle}/{ips[0]}") is None
    assert client.zcard(keys.due(shard_of("node-1"))) == 0


@pytest.mark.parametrize("ready, synced", [(False, True), (True, False)])
def test_nothing_happens_until_the_datastore_is_ready_and_the_mirror_synced(
    client: redis.Redis,
    keys: Keys,
    mirror: Mirror,
    cluster: Cluster,
    clock: FakeClock,
    enqueued: list[int],
    ready: bool,
    synced: bool,
) -> None:
    cluster.builder.add_node("node-1")
    cluster.builder.add_pod("default", "web-0", "node-1")
    mirror.set_config(GRACE, ready)
    mirror.relist(Kind.PODS, [])  # no pods mirrored: every pod IP would look leaked
    mirror.relist(Kind.NODES, cluster.nodes())
    mirror.relist(Kind.BLOCKS, cluster.blocks())
    if synced:
        mirror.mark_synced()
    before = dirty_ids(client, keys)
    requeued: list[int] = []
    stats = run(client, keys, clock, requeued)
    assert stats.gated and stats.validated == 0 and stats.batches == 0
    assert dirty_ids(client, keys) == before
    assert client.zcard(keys.inflight(shard_of("node-1"))) == 0
    assert not client.exists(keys.queued(shard_of("node-1")))
    assert requeued == []  # no hot loop: the watcher kicks the shard when the gate opens
    enqueued.clear()
    if not ready:
        mirror.set_config(GRACE, True)
    else:
        mirror.mark_synced()
    assert shard_of("node-1") in enqueued
