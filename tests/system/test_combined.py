"""`ipamgc combined`: the watcher, a worker and the leader in one process collect as the three processes do.

What users rely on: the leaks are released and nothing in use is; the three components beat and are
healthy under their own names; `/metrics` serves the watcher's and the leader's readings; SIGTERM stops
the whole with status 0; a component that ends on its own (the watcher's Lease taken) takes the process
down with that component's status, so the orchestrator restarts it; a wrong flag is an error, not a start.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
from pathlib import Path

import redis
from kubernetes import client as k8s

from lab.apiserver.apiserver import SimApiServer
from lab.cluster.cluster import SimCluster
from producer.watcher import EXIT_LOST_LEADERSHIP
from tests.fixtures.stack import ROOT, stop_processes
from tests.ipamgc.commands.test_endpoints import free_port, healthy, http_probe, scrape, value
from tests.polling import wait_until

INSTANCE = "one-0"
# Short Leases and kicks, as the other process tests run the components (`lab.chaos`'s, less its metrics).
FAST = {
    "IPAMGC_KICK_INTERVAL": "0.2",
    "IPAMGC_ELECTION_LEASE": "2",
    "IPAMGC_ELECTION_RENEW": "1.5",
    "IPAMGC_ELECTION_RETRY": "1",
    "IPAMGC_WORK_LEASE": "2",
    "IPAMGC_JOB_IDLE": "0.5",
}


def _start(server: SimApiServer, redis_url: str, tmp_path: Path, *extra: str) -> subprocess.Popen[bytes]:
    kubeconfig = str(server.write_kubeconfig(tmp_path / "kubeconfig"))
    argv = [sys.executable, "-m", "ipamgc.commands.combined", "--redis-url", redis_url]
    argv += ["--kubeconfig", kubeconfig, "--lease-namespace", "default", "--log-level", "WARNING", *extra]
    env = {**os.environ, **FAST, "IPAMGC_INSTANCE": INSTANCE}
    with (tmp_path / "combined.log").open("wb") as out:
        return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


def test_one_process_releases_the_leaks_beats_as_three_and_stops_on_sigterm(
    server: SimApiServer, sim: SimCluster, client: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    sim.bootstrap("1s")
    sim.populate(nodes=4, pods_per_node=5)
    sim.leak_pod_deleted_without_cni_del("ns-0", "pod-0000000")
    sim.leak_node_deleted("node-00003")
    expected = sim.truth.leaked_ips()
    in_use = sim.truth.in_use_ips()
    port = free_port()
    proc = _start(server, redis_url, tmp_path, "--metrics-port", str(port))
    try:
        released = lambda: {u.ip for u in sim.truth.released_leaks()}  # noqa: E731
        wait_until(lambda: released() == expected, timeout=60, what="every leak released")
        sim.leak_terminal_pod("ns-1", "pod-0000001")  # a leak after the cold start, through the watch
        later = sim.truth.leaked_ips()
        assert later and not later & expected
        wait_until(lambda: released() == expected | later, timeout=30, what="the later leak released")
        assert not sim.truth.violations
        assert sim.truth.in_use_ips() == in_use - released()

        for component in ("watcher", "worker", "leader"):
            assert wait_until(lambda c=component: healthy(redis_url, c, INSTANCE), timeout=20), component  # type: ignore[misc]
        page = wait_until(lambda: (p := scrape(port)) and value(p, "ipamgc_leader_epoch") == 1 and p, 20)
        assert value(page, "ipamgc_watcher_is_leader") == 1
        assert value(page, "ipamgc_leader_is_leader") == 1
        assert value(page, "ipamgc_releases_total", result="released", object="ip") == len(released())
        status, body = http_probe(port, "/healthz")
        assert status == 200 and "watcher:active worker:running leader:leading" in body
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=30)
        finally:
            stop_processes([proc])
    assert code == 0, (tmp_path / "combined.log").read_text()[-3000:]


def test_a_watcher_that_loses_its_lease_takes_the_process_down_with_its_status(
    server: SimApiServer, sim: SimCluster, client: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    sim.bootstrap("15m0s")
    sim.populate(nodes=1, pods_per_node=2)
    proc = _start(server, redis_url, tmp_path, "--metrics-port", "0")
    try:
        with server.api_client() as api:
            coord = k8s.CoordinationV1Api(api)
            wait_until(lambda: healthy(redis_url, "watcher", INSTANCE), timeout=30, what="the watcher active")
            lease = coord.read_namespaced_lease("ipamgc-watcher", "default")
            lease.spec.holder_identity = "intruder"
            lease.spec.lease_duration_seconds = 60
            lease.spec.renew_time = dt.datetime.now(dt.UTC)
            coord.replace_namespaced_lease("ipamgc-watcher", "default", lease)
        # The renew deadline is 1.5 s: the watcher gives up; the worker and the leader are stopped with it.
        code = proc.wait(timeout=60)
    finally:
        stop_processes([proc])
    assert code == EXIT_LOST_LEADERSHIP, (tmp_path / "combined.log").read_text()[-3000:]


def test_a_wrong_flag_is_one_error_and_no_start(redis_url: str, tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "ipamgc.commands.combined", "--redis-url", redis_url]
    done = subprocess.run(
        [*argv, "--resync-period", "soon"], cwd=ROOT, capture_output=True, timeout=60, check=False
    )
    assert done.returncode == 2
    assert "--resync-period" in done.stderr.decode() and "Traceback" not in done.stderr.decode()
