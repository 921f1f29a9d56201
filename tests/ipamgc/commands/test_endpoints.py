"""The component commands serve `/metrics` and beat: `ipamgc watch` and `ipamgc lead` against the simulated
cluster, two `ipamgc work` processes on one port (the second runs without metrics), all as real processes
scraped over HTTP and probed with `python -m ipamgc.commands.health` and over HTTP (`/healthz`, `/readyz`)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis
from prometheus_client.parser import text_string_to_metric_families

from lab.apiserver.apiserver import SimApiServer
from lab.cluster.cluster import SimCluster
from tests.fixtures.stack import ROOT, stop_processes
from tests.fixtures.watcher_metrics import expected_gauges
from tests.polling import wait_until

Scrape = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> Scrape | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
            text = resp.read().decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def http_probe(port: int, path: str) -> tuple[int, str]:
    """(status, body) of `path?verbose` on a metrics port: the kubelet's httpGet probe."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}?verbose", timeout=2) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def healthy(redis_url: str, component: str, instance: str, probe: str = "readiness") -> bool:
    args = [sys.executable, "-m", "ipamgc.commands.health", "--component", component, "--probe", probe]
    env = {**os.environ, "IPAMGC_INSTANCE": instance, "REDIS_URL": redis_url}
    done = subprocess.run(args, check=False, cwd=ROOT, env=env, capture_output=True, timeout=30)
    return done.returncode == 0


@contextmanager
def processes(*commands: tuple[list[str], str, Path]) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Each (argv, instance, log file) as a process with IPAMGC_INSTANCE set; stopped and reaped on exit."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for argv, instance, log in commands:
            env = {**os.environ, "IPAMGC_INSTANCE": instance}
            with log.open("wb") as out:
                procs.append(subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT))
        yield procs
    finally:
        stop_processes(procs)


def value(samples: Scrape | None, name: str, **labels: str) -> float | None:
    return None if samples is None else samples.get((name, tuple(sorted(labels.items()))))


def test_watch_and_lead_serve_their_metrics_and_beat(
    server: SimApiServer, sim: SimCluster, client: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    sim.bootstrap("15m")
    sim.populate(nodes=2, pods_per_node=3)
    kubeconfig = str(server.write_kubeconfig(tmp_path / "kubeconfig"))
    wport, lport = free_port(), free_port()
    common = ["--redis-url", redis_url, "--kubeconfig", kubeconfig, "--log-level", "WARNING"]
    watch = [sys.executable, "-m", "ipamgc.commands.watch", *common, "--election-namespace", "default"]
    lead = [sys.executable, "-m", "ipamgc.commands.lead", *common, "--lease-namespace", "default"]
    with processes(
        ([*watch, "--metrics-port", str(wport)], "w-0", tmp_path / "watch.log"),
        ([*lead, "--metrics-port", str(lport)], "l-0", tmp_path / "lead.log"),
    ):
        in_use = sum(expected_gauges(sim.store)["in_use"].values())

        def watcher_ready() -> Scrape | None:
            s = scrape(wport)
            total = sum(v for (n, _), v in (s or {}).items() if n == "ipam_allocations_in_use")
            return s if total == in_use else None

        s = wait_until(watcher_ready, timeout=20)
        assert value(s, "ipamgc_watcher_is_leader") == 1
        assert value(s, "ipamgc_build_info", component="watcher", version="0.1.0") == 1
        assert value(s, "ipam_ippool_size", ippool="default-ipv4-ippool") == 2**22
        assert value(s, "ipamgc_watch_lists_total", kind="pods") == 1
        assert value(s, "ipamgc_shard_dirty", shard="0") is not None
        assert any(n == "process_cpu_seconds_total" for n, _ in s)

        # the Lease is held (is_leader 1) a moment before the term's epoch is set: wait for both, one scrape
        def leading() -> Scrape | bool | None:
            page = scrape(lport)
            return (
                value(page, "ipamgc_leader_is_leader") == 1
                and value(page, "ipamgc_leader_epoch") == 1
                and page
            )

        t = wait_until(leading, 20)
        assert value(t, "ipamgc_leader_epoch") == 1
        assert value(t, "ipamgc_releases_total", result="released", object="ip") == 0
        assert healthy(redis_url, "watcher", "w-0") and healthy(redis_url, "leader", "l-0")
        assert not healthy(redis_url, "worker", "w-0")
        for path in ("/healthz", "/livez", "/readyz"):
            assert http_probe(wport, path) == (200, f"[+]watcher active\n{path[1:]} check passed\n")
            assert http_probe(lport, path) == (200, f"[+]leader leading\n{path[1:]} check passed\n")


def test_workers_beat_and_share_a_port_without_failing(
    redis_url: str, client: redis.Redis, tmp_path: Path
) -> None:
    port = free_port()
    work = [
        sys.executable,
        "-m",
        "ipamgc.commands.work",
        "--redis-url",
        redis_url,
        "--metrics-port",
        str(port),
    ]
    with processes(
        (work, "k-0", tmp_path / "k0.log"),
        (work, "k-1", tmp_path / "k1.log"),
        ([*work[:-2], "--metrics-port", "0"], "k-2", tmp_path / "k2.log"),
    ) as procs:
        wait_until(lambda: all(healthy(redis_url, "worker", f"k-{i}") for i in range(3)), timeout=20)
        assert value(scrape(port), "ipamgc_build_info", component="worker", version="0.1.0") == 1
        assert http_probe(port, "/readyz") == (200, "[+]worker running\nreadyz check passed\n")
        logs = "".join((tmp_path / f"k{i}.log").read_text() for i in range(3))
        assert logs.count("metrics not served") == 1  # the second on the port; the third serves none
        assert all(p.poll() is None for p in procs)
        procs[0].send_signal(signal.SIGTERM)
        assert procs[0].wait(timeout=15) == 0
        assert not healthy(redis_url, "worker", "k-0")  # a clean stop removes the heartbeat
        assert healthy(redis_url, "worker", "k-1", probe="liveness")
