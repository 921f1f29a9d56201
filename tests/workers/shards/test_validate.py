"""The shard job decides exactly as Calico's GC would, on scenarios built with `ClusterBuilder`."""

from __future__ import annotations

import dataclasses

import pytest
import redis

from producer.mirror import Mirror
from producer.relist import Kind
from shared.clock import FakeClock
from shared.gcrecords import Candidate, decode_candidate, encode_candidate
from shared.keys import REDECIDE_AFTER_SECONDS, Keys, alloc_id_of
from shared.records import encode_node
from shared.shard import DEFAULT_SHARDS, shard_of
from tests.fixtures.redis import Cluster, decisions, dirty_ids
from tests.handles import handle_fields
from workers.common.redis_state import read_state
from workers.shards.batches import validate_batches
from workers.shards.validate import ShardStats, _ShardJob, validate_shard
from workers.shards.writes import DUE_EPSILON_SECONDS

GRACE = 900.0


def start(mirror: Mirror, cluster: Cluster, grace: float | None = GRACE, ready: bool = True) -> None:
    mirror.set_config(grace, ready)
    mirror.relist(Kind.NODES, cluster.nodes())
    mirror.relist(Kind.PODS, cluster.pods())
    mirror.relist(Kind.BLOCKS, cluster.blocks())
    mirror.mark_synced()


def run(client: redis.Redis, keys: Keys, clock: FakeClock, requeued: list[int] | None = None) -> ShardStats:
    """Run a job on every shard, as the workers would; returns the summed counters."""
    total = ShardStats(shard=-1)
    for s in range(DEFAULT_SHARDS):
        stats = validate_shard(s, client=client, keys=keys, clock=clock, enqueue=(requeued or []).append)
        for f in dataclasses.fields(ShardStats):
            value = getattr(stats, f.name)
            if f.name != "shard" and isinstance(value, int) and not isinstance(value, bool):
                setattr(total, f.name, getattr(total, f.name) + value)
        total.gated |= stats.gated
    return total


def candidate(client: redis.Redis, keys: Keys, node: str, alloc_id: str) -> Candidate | None:
    raw = client.hget(keys.cand(shard_of(node)), alloc_id)
    return None if raw is None else decode_candidate(raw)


def due(client: redis.Redis, keys: Keys, node: str, alloc_id: str) -> float | None:
    return client.zscore(keys.due(shard_of(node)), alloc_id)


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


def test_a_job_out_of_time_budget_requeues_its_shard(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, clock: FakeClock
) -> None:
    cluster.builder.add_node("node-1")
    cluster.builder.add_pod("default", "web-0", "node-1")
    start(mirror, cluster)
    s = shard_of("node-1")
    requeued: list[int] = []
    stats = validate_shard(
        s, client=client, keys=keys, clock=clock, enqueue=requeued.append, batch_size=1, budget=0
    )
    assert (stats.batches, stats.requeued, requeued) == (1, True, [s])
    assert client.exists(keys.queued(s))
    stats = validate_shard(s, client=client, keys=keys, clock=clock, enqueue=requeued.append)
    assert (stats.validated, stats.requeued) == (1, False)
    assert not client.exists(keys.queued(s))


def test_batches_of_several_shards_share_their_round_trips_and_decide_as_one_by_one(
    client: redis.Redis,
    keys: Keys,
    mirror: Mirror,
    cluster: Cluster,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A lingering job holding several shards validates what it took from all of them with one pipeline
    of reads, one of the nodes and pods they name, and one of writes (`validate_batches`); its
    decisions and timers are those of one job per shard."""
    nodes = [f"node-{i}" for i in range(12)]
    by_shard: dict[int, str] = {}
    for n in nodes:
        by_shard.setdefault(shard_of(n), n)
    assert len(by_shard) >= 2, "the nodes span at least two shards"
    leaked: list[str] = []
    for s, node in sorted(by_shard.items()):
        cluster.builder.add_node(node)
        handle, ips = cluster.builder.add_pod("default", f"gone-{s}", node)
        cluster.builder.add_pod("default", f"kept-{s}", node)
        leaked.append(f"{handle}/{ips[0]}")
    start(mirror, cluster)
    run(client, keys, clock)
    for s in sorted(by_shard):
        cluster.builder.delete_pod("default", f"gone-{s}", cni_del=False)
        mirror.delete_pod("default", f"gone-{s}")
    assert run(client, keys, clock).candidates == len(by_shard)
    clock.advance(GRACE + 1)
    for s in sorted(by_shard):  # their grace has ended: every gone pod's IP is dirty again
        client.sadd(keys.dirty(s), *[i for i in leaked if shard_of(by_shard[s]) == s])

    executed: list[int] = []
    real = redis.client.Pipeline.execute

    def counting(self: redis.client.Pipeline, raise_on_error: bool = True) -> list[object]:
        executed.append(len(self.command_stack))
        return real(self, raise_on_error)

    monkeypatch.setattr(redis.client.Pipeline, "execute", counting)
    jobs = [_ShardJob(s, client, keys, clock, 1000, 60.0) for s in sorted(by_shard)]
    leases = [job.queue.take(clock.now(), 60.0, 1000) for job in jobs]
    assert all(lease.ids for lease in leases)
    state = read_state(client, keys)
    executed.clear()
    dues = validate_batches(list(zip(jobs, leases, strict=True)), state, clock.now())
    monkeypatch.setattr(redis.client.Pipeline, "execute", real)
    # the batches' records, the nodes and pods they name, every batch's writes (the confirmed leaks'
    # block resourceVersions are one HMGET of their own, not a pipeline)
    assert len(executed) == 3, executed
    assert dues == [None] * len(jobs)
    got = sorted(d.alloc_id for d in decisions(client, keys))
    assert got == sorted(leaked)
    assert all(client.zcard(keys.inflight(s)) == 0 for s in by_shard)
