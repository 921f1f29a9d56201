"""The watcher over real HTTP: each watched event dirties exactly what it may have changed; a 410 relists
and emits the deletes the watch missed; malformed objects keep IPs; configuration follows the cluster."""

from __future__ import annotations

import json

import redis

from lab.apiserver.apiserver import SimApiServer
from lab.cluster.cluster import SimCluster
from producer import slim
from producer.handoff import BLOCK_WEIGHT, _weight
from producer.kinds import Kind
from producer.reflector import ListPage
from shared.config import GraceOverride
from shared.keys import pod_key
from shared.records import decode_pod
from shared.shard import DEFAULT_SHARDS, shard_of
from tests.fixtures.stack import (
    KEYS,
    allocation_ids,
    caught_up,
    clear_dirty,
    dirty_ids,
    fast_settings,
    pod_allocation_ids,
    pod_mirrored,
    running_watcher,
)
from tests.polling import holds_for, wait_until


def test_each_watched_event_dirties_exactly_what_it_may_have_changed(
    server: SimApiServer, sim: SimCluster, client: redis.Redis, redis_url: str
) -> None:
    sim.bootstrap("15m0s")
    sim.populate(nodes=3, pods_per_node=3)
    with running_watcher(server, fast_settings(redis_url)) as rw:
        w = rw.watcher
        wait_until(lambda: w.synced.is_set() and caught_up(w, server), timeout=10)
        # A first list on a Redis never synced writes no dirty id: it leaves a pass over every
        # allocation to the workers, one per shard (`P:revalidate:{s}`), set before the gate opened.
        assert dirty_ids(client) == set()
        assert all(client.exists(KEYS.revalidate(s)) for s in range(DEFAULT_SHARDS))
        client.delete(*(KEYS.revalidate(s) for s in range(DEFAULT_SHARDS)))  # no worker runs here

        def after(expected: set[str]) -> None:
            wait_until(lambda: caught_up(w, server) and dirty_ids(client) == expected, timeout=10)
            assert dirty_ids(client) == expected
            clear_dirty(client)

        clear_dirty(client)
        # A block event (CNI ADD on a live node): only the new allocation.
        ips = set(sim.create_pod("ns-new", "web", "node-00001"))
        after(allocation_ids(sim, ips=ips))
        # A pod deleted without CNI DEL: the pod's allocations.
        expected = pod_allocation_ids(sim, "ns-1", "pod-0000001")
        sim.leak_pod_deleted_without_cni_del("ns-1", "pod-0000001")
        after(expected)
        assert not pod_mirrored(client, "ns-1", "pod-0000001")
        # A pod phase change (terminal): the pod's allocations.
        sim.leak_terminal_pod("ns-4", "pod-0000004")
        after(pod_allocation_ids(sim, "ns-4", "pod-0000004"))
        # A node deleted (its pods still there): every allocation of the node, tunnel included, and its
        # blocks go to the shard's dirtyblocks set.
        expected = allocation_ids(sim, node="node-00002")
        blocks = {b["spec"]["cidr"] for b in sim.store.list("ipamblocks")["items"]}
        host_blocks = {c for c in blocks if _host(sim, c) == "node-00002"}
        sim.delete_node("node-00002")
        after(expected)
        assert {m.decode() for m in client.smembers(KEYS.dirtyblocks(shard_of("node-00002")))} == host_blocks
        assert w.stats.get("events", "pods") >= 4 and w.stats.get("events", "nodes") == 1


def _host(sim: SimCluster, cidr: str) -> str | None:
    for raw in sim.store.list("ipamblocks")["items"]:
        if raw["spec"]["cidr"] == cidr:
            affinity = raw["spec"].get("affinity") or ""
            return affinity.removeprefix("host:") if affinity.startswith("host:") else None
    return None


def test_a_410_relists_and_emits_the_deletes_the_watch_missed(
    server: SimApiServer, sim: SimCluster, client: redis.Redis, redis_url: str
) -> None:
    sim.bootstrap("15m0s")
    sim.populate(nodes=2, pods_per_node=3)
    with running_watcher(server, fast_settings(redis_url)) as rw:
        w = rw.watcher
        wait_until(lambda: w.synced.is_set() and caught_up(w, server), timeout=10)
        clear_dirty(client)

        # Pods: the watch cannot reconnect while a pod is deleted, and history is compacted meanwhile.
        down = server.faults.add(verbs={"watch"}, resources={"pods"}, error_rate=1.0, error_code=503)
        assert server.drop_watches("pods") == 1
        wait_until(lambda: w.stats.get("errors", "pods") >= 1, timeout=10)
        expected = pod_allocation_ids(sim, "ns-1", "pod-0000001")
        sim.leak_pod_deleted_without_cni_del("ns-1", "pod-0000001")
        server.compact()
        server.faults.remove(down.id)
        relisted = ("relists", "pods")
        wait_until(lambda: w.stats.get(*relisted) == 1 and not pod_mirrored(client, "ns-1", "pod-0000001"))
        assert w.stats.get("expired", "pods") >= 1
        wait_until(lambda: dirty_ids(client) == expected, timeout=5)
        clear_dirty(client)

        # Nodes: the fault injector's expire rule answers the re-watch with 410.
        down = server.faults.add(verbs={"watch"}, resources={"nodes"}, error_rate=1.0, error_code=500)
        assert server.drop_watches("nodes") == 1
        wait_until(lambda: w.stats.get("errors", "nodes") >= 1, timeout=10)
        expected = allocation_ids(sim, node="node-00001")
        sim.delete_node("node-00001")
        server.faults.remove(down.id)
        server.faults.add(verbs={"watch"}, resources={"nodes"}, expire=True, times=1)
        relisted = ("relists", "nodes")
        wait_until(lambda: w.stats.get(*relisted) == 1 and not client.hexists(KEYS.nodes, "node-00001"))
        wait_until(lambda: caught_up(w, server) and dirty_ids(client) == expected, timeout=5)
        assert dirty_ids(client) == expected


def test_malformed_objects_are_counted_skipped_and_keep_ips(
    server: SimApiServer, sim: SimCluster, client: redis.Redis, redis_url: str
) -> None:
    sim.bootstrap("15m0s")
    sim.populate(nodes=1, pods_per_node=2)
    with running_watcher(server, fast_settings(redis_url)) as rw:
        w = rw.watcher
        wait_until(lambda: w.synced.is_set() and caught_up(w, server), timeout=10)
        # A pod whose reported IP cannot be parsed: counted as malformed and mirrored with its IPs as
        # written (the rules keep it, `pod-ip-unparsable`, unless it is evicted or finished), never deleted.
        pod = sim.store.get("pods", "ns-0", "pod-0000000")
        pod["status"]["podIP"] = "not-an-ip"
        sim.store.replace("pods", "ns-0", "pod-0000000", pod, subresource="status")
        wait_until(lambda: w.stats.get("malformed", "pods") == 1 and caught_up(w, server), timeout=10)
        stand_in = decode_pod(
            "ns-0", "pod-0000000", client.hget(KEYS.pods, pod_key("ns-0", "pod-0000000")) or b""
        )
        assert (stand_in.pod_ip, stand_in.node_name) == ("not-an-ip", pod["spec"]["nodeName"])
        # A block that no longer parses: the mirrored version stays, through a relist too.
        raw = sim.store.list("ipamblocks")["items"][0]
        cidr = raw["spec"]["cidr"]
        before = client.hget(KEYS.blocks, cidr)
        raw["spec"]["allocations"] = raw["spec"]["allocations"][:3]
        sim.store.replace("ipamblocks", None, raw["metadata"]["name"], raw)
        wait_until(lambda: w.stats.get("malformed", "ipamblocks") == 1 and caught_up(w, server), timeout=10)
        for kind in ("pods", "ipamblocks"):
            server.faults.add(verbs={"watch"}, resources={kind}, expire=True, times=1)
            server.drop_watches(kind)
        relisted = ("relists", "ipamblocks"), ("relists", "pods")
        wait_until(lambda: all(w.stats.get(*r) == 1 for r in relisted) and caught_up(w, server), timeout=10)
        assert client.hget(KEYS.blocks, cidr) == before
        assert pod_mirrored(client, "ns-0", "pod-0000000")
        assert w.stats.get("malformed", "ipamblocks") == 2 and w.stats.get("malformed", "pods") == 2


def test_configuration_follows_the_cluster_unless_overridden(
    server: SimApiServer, sim: SimCluster, client: redis.Redis, redis_url: str
) -> None:
    sim.bootstrap("1m0s")
    sim.populate(nodes=1, pods_per_node=1)

    def state() -> tuple[bytes | None, bytes | None]:
        grace, ready = client.hmget(KEYS.state, ["leak_grace_period", "datastore_ready"])
        return grace, ready

    with running_watcher(server, fast_settings(redis_url)) as rw:
        w = rw.watcher
        wait_until(w.synced.is_set, timeout=10)
        assert state() == (b"60.0", b"1")
        clear_dirty(client)
        kcc = sim.store.get("kubecontrollersconfigurations", None, "default")
        del kcc["spec"]["controllers"]["node"]["leakGracePeriod"]  # unset: Calico's "no GC on live nodes"
        sim.store.replace("kubecontrollersconfigurations", None, "default", kcc)
        wait_until(lambda: state() == (None, b"1"), timeout=10)
        wait_until(lambda: len(dirty_ids(client)) == len(allocation_ids(sim, node="node-00000")), timeout=5)
        sim.store.delete("clusterinformations", None, "default")  # deleted ⇒ not ready (spec §3.3)
        wait_until(lambda: state() == (None, b"0"), timeout=10)
        sim.store.delete("kubecontrollersconfigurations", None, "default")  # absent ⇒ Calico's 15m
        wait_until(lambda: state() == (b"900.0", b"0"), timeout=10)
    # A new watcher on an empty state: the flag wins over the cluster; no ClusterInformation at start
    # means ready, as Calico initialises datastoreReady = true.
    client.delete(KEYS.state)
    with running_watcher(server, fast_settings(redis_url, leak_grace_override=GraceOverride(30.0))) as rw:
        wait_until(rw.watcher.synced.is_set, timeout=10)
        assert state() == (b"30.0", b"1")


def test_api_errors_back_off_and_429_honours_retry_after(
    server: SimApiServer, sim: SimCluster, client: redis.Redis, redis_url: str
) -> None:
    sim.bootstrap("15m0s")
    sim.populate(nodes=1, pods_per_node=1)
    server.faults.add(
        verbs={"list"}, resources={"nodes"}, error_code=429, error_rate=1.0, retry_after=1.0, times=1
    )
    server.faults.add(verbs={"list"}, resources={"pods"}, error_code=503, error_rate=1.0, times=2)
    with running_watcher(server, fast_settings(redis_url)) as rw:
        wait_until(rw.watcher.synced.is_set, timeout=10)
    nodes = server.find_requests(verb="list", resource="nodes")
    assert [r.status for r in nodes] == [429, 200]
    assert nodes[1].timestamp - nodes[0].timestamp >= 0.95  # Retry-After: 1
    pods = server.find_requests(verb="list", resource="pods")
    assert [r.status for r in pods] == [503, 503, 200]
    assert pods[2].timestamp - pods[0].timestamp < 0.95  # full jitter under a 0.3 s cap
    assert rw.watcher.stats.get("errors", "nodes") == 1 and rw.watcher.stats.get("errors", "pods") == 2


def test_full_resyncs_follow_the_grace_period_as_it_changes(
    server: SimApiServer, sim: SimCluster, client: redis.Redis, redis_url: str
) -> None:
    """Every grace / 2 (Calico's ticker), re-read when the grace period changes: the resync thread sleeps
    until its next resync and is woken by a new grace period (it used to wake every second to look)."""
    sim.bootstrap("1h0m0s")  # a resync every 30 minutes: none during the test
    sim.populate(nodes=1, pods_per_node=1)
    with running_watcher(server, fast_settings(redis_url, resync_period_seconds=None)) as rw:
        w = rw.watcher
        wait_until(w.synced.is_set, timeout=10)
        assert w.stats.get("resyncs") == 0
        kcc = sim.store.get("kubecontrollersconfigurations", None, "default")
        kcc["spec"]["controllers"]["node"]["leakGracePeriod"] = "2s"  # a resync every second
        sim.store.replace("kubecontrollersconfigurations", None, "default", kcc)
        wait_until(lambda: w.stats.get("resyncs") >= 3, timeout=10)
        kcc = sim.store.get("kubecontrollersconfigurations", None, "default")
        kcc["spec"]["controllers"]["node"]["leakGracePeriod"] = "1h0m0s"
        sim.store.replace("kubecontrollersconfigurations", None, "default", kcc)
        wait_until(lambda: client.hget(KEYS.state, "leak_grace_period") == b"3600.0", timeout=10)
        done = w.stats.get("resyncs")
        # At most the one already under way when the grace period changed: the next is 30 minutes away,
        # not a second (an absence, so watched for a fixed window).
        holds_for(lambda: w.stats.get("resyncs") <= done + 1, 2.5, interval=0.05, what="no second resync")


def test_pending_block_pages_weigh_their_ordinals_and_the_cold_start_completes(
    server: SimApiServer, sim: SimCluster, client: redis.Redis, redis_url: str
) -> None:
    """A block counts against `queue_size` as `BLOCK_WEIGHT` objects, and the publisher takes back what it
    counted: with a queue of 10 and pages of two blocks, each block page fills the queue alone, and
    every page still gets mirrored."""
    sim.bootstrap("15m0s")
    sim.populate(nodes=12, pods_per_node=2)
    settings = fast_settings(redis_url, queue_size=10, page_size=2)
    with running_watcher(server, settings) as rw:
        w = rw.watcher
        wait_until(lambda: w.synced.is_set() and caught_up(w, server), timeout=20)
        mirrored = {c.decode() for c in client.hkeys(KEYS.blocks)}
        listed = server.store.list("ipamblocks")["items"]
        assert len(mirrored) >= 12 and mirrored == {b["spec"]["cidr"] for b in listed}
        assert w._paged == 0  # everything counted in was counted out
    block = slim.block(json.dumps(listed[0]).encode())
    assert block is not None
    assert _weight(ListPage(Kind.BLOCKS, (block[0],) * 2, True)) == 2 * BLOCK_WEIGHT
    assert _weight(ListPage(Kind.PODS, ("a", "b", "c"), True)) == 3


def test_a_cold_start_is_mirrored_as_it_arrives_not_after_the_batch_window(
    server: SimApiServer, sim: SimCluster, redis_url: str
) -> None:
    """List pages and a list's end are taken at once: with a 5 s batch window the watcher still syncs in
    well under one (it used to wait out the window after pages that came while it was busy)."""
    sim.bootstrap("15m0s")
    sim.populate(nodes=4, pods_per_node=3)
    settings = fast_settings(redis_url, batch_wait_seconds=5.0, page_size=3)
    with running_watcher(server, settings) as rw:
        wait_until(rw.watcher.synced.is_set, timeout=3)
