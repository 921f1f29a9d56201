"""One watcher publishes: a standby waits on the Lease and takes over when the leader stops; a leader that
loses the Lease stops publishing and exits."""

from __future__ import annotations

import datetime as dt
import signal
import subprocess
import sys
from pathlib import Path

import redis
from kubernetes import client as k8s

from lab.apiserver.apiserver import SimApiServer
from lab.cluster.cluster import SimCluster
from producer.watcher import EXIT_LOST_LEADERSHIP, EXIT_OK
from tests.fixtures.stack import KEYS, ROOT, caught_up, fast_settings, running_watcher, stop_processes
from tests.polling import wait_until


def test_a_standby_waits_and_takes_over_when_the_leader_stops(
    server: SimApiServer, sim: SimCluster, client: redis.Redis, redis_url: str
) -> None:
    sim.bootstrap("15m0s")
    sim.populate(nodes=2, pods_per_node=2)
    settings = fast_settings(redis_url)
    with running_watcher(server, settings) as first:
        wait_until(first.watcher.synced.is_set, timeout=10)
        assert first.watcher.elector is not None
        leader = first.watcher.elector.identity
        with running_watcher(server, settings) as second:
            standby = second.watcher
            assert standby.elector is not None

            def observed_holder() -> str | None:
                assert standby.elector is not None
                return standby.elector.lease.observed_holder

            wait_until(lambda: observed_holder() == leader, timeout=10)
            assert not standby.leading and standby.stats.snapshot() == {}
            first.watcher.stop()
            first.thread.join(timeout=10)
            assert first.exit_code == EXIT_OK
            # The leader released the Lease: the standby acquires it within one retry period (1 s).
            wait_until(lambda: standby.synced.is_set() and caught_up(standby, server), timeout=5)
            assert standby.leading and standby.stats.get("lists", "pods") == 1
            sim.leak_pod_deleted_without_cni_del("ns-1", "pod-0000001")
            wait_until(lambda: not client.hexists(KEYS.pods, "ns-1/pod-0000001"), timeout=5)


def test_a_leader_that_loses_the_lease_stops_publishing_and_exits(
    server: SimApiServer, sim: SimCluster, client: redis.Redis, redis_url: str
) -> None:
    sim.bootstrap("15m0s")
    sim.populate(nodes=1, pods_per_node=2)
    settings = fast_settings(redis_url)
    with running_watcher(server, settings) as rw, server.api_client() as api:
        w = rw.watcher
        wait_until(lambda: w.synced.is_set() and caught_up(w, server), timeout=10)
        coord = k8s.CoordinationV1Api(api)
        lease = coord.read_namespaced_lease(settings.election_name, settings.election_namespace)
        lease.spec.holder_identity = "intruder"
        lease.spec.lease_duration_seconds = 60
        lease.spec.renew_time = dt.datetime.now(dt.UTC)
        coord.replace_namespaced_lease(settings.election_name, settings.election_namespace, lease)
        # The renew deadline is 2 s: the leader gives up, stops publishing and exits.
        rw.thread.join(timeout=10)
        assert not rw.thread.is_alive()
        assert rw.exit_code == EXIT_LOST_LEADERSHIP
        assert w.stopping and not w.leading
        published = client.hget(KEYS.pods, "ns-0/pod-0000000")
        sim.leak_terminal_pod("ns-0", "pod-0000000")
        assert client.hget(KEYS.pods, "ns-0/pod-0000000") == published
        wait_until(lambda: server.open_watches == 0, timeout=5)  # every watch connection was closed


def test_the_watch_command_stops_on_sigterm_and_releases_the_lease(
    server: SimApiServer, sim: SimCluster, client: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    sim.bootstrap("15m0s")
    sim.populate(nodes=1, pods_per_node=1)
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
    args = ["--kubeconfig", str(kubeconfig), "--redis-url", redis_url, "--election-namespace", "default"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "ipamgc.commands.watch", *args, "--log-level", "WARNING"], cwd=ROOT
    )
    try:
        wait_until(lambda: client.hget(KEYS.state, "synced") == b"1", timeout=15)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == EXIT_OK
    finally:
        stop_processes([proc])
    with server.api_client() as api:
        lease = k8s.CoordinationV1Api(api).read_namespaced_lease("ipamgc-watcher", "default")
    assert not lease.spec.holder_identity  # released: a standby takes over within one retry period
