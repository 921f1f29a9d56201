"""End-to-end fixtures: a real Redis, the simulated cluster over real HTTP, the real watcher (in a thread of
this process, with fast timings) and real RQ worker processes (`python -m ipamgc.commands.work`).

Nothing here sleeps to wait for a condition: `wait_until` (tests/kube) polls with a deadline.  Every
thread and process started here is stopped and reaped in a `finally`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

from lab.apiserver.apiserver import SimApiServer
from lab.cluster.cluster import SimCluster
from producer import kube
from producer.kinds import WATCHED
from producer.watcher import Watcher
from redisio.client import redis_client
from shared.config import Settings
from shared.gcrecords import Decision
from shared.keys import Keys, alloc_id_of, pod_key
from shared.parse import parse_block
from shared.shard import DEFAULT_SHARDS
from tests.handles import handle_fields
from tests.redis import conftest as redis_fixtures
from tests.redis.conftest import Endpoint

# The real Redis of tests/redis (a redis-server on a free port, flushed around each test), shared here.
redis_endpoint = redis_fixtures.redis_endpoint
client = redis_fixtures.client

ROOT = Path(__file__).resolve().parents[2]
KEYS = Keys()


@pytest.fixture
def redis_url(redis_endpoint: Endpoint, client: redis.Redis) -> str:
    """The URL of the session's Redis (flushed around the test by `client`)."""
    return f"redis://{redis_endpoint.host}:{redis_endpoint.port}/0"


@pytest.fixture
def server() -> Iterator[SimApiServer]:
    with SimApiServer(bookmark_interval=0.2) as srv:
        yield srv


@pytest.fixture
def sim(server: SimApiServer) -> SimCluster:
    return SimCluster(server.store, seed=11)


def fast_settings(redis_url: str, **overrides: Any) -> Settings:
    """Timings for tests: kicks every 0.1 s, short back-offs, a 3 s Lease, no periodic resync."""
    values: dict[str, Any] = {
        "redis_url": redis_url,
        "kick_interval_seconds": 0.1,
        "batch_wait_seconds": 0.01,
        "resync_period_seconds": 3600.0,
        "backoff_base_seconds": 0.05,
        "backoff_max_seconds": 0.3,
        "election_namespace": "default",
        "election_lease_seconds": 3,
        "election_renew_seconds": 2.0,
        "election_retry_seconds": 1.0,
        "work_lease_seconds": 2.0,
        "job_idle_seconds": 0.5,
    }
    values.update(overrides)
    return Settings(**values)


@dataclass
class RunningWatcher:
    watcher: Watcher
    thread: threading.Thread
    result: dict[str, int] = field(default_factory=dict)

    @property
    def exit_code(self) -> int | None:
        return self.result.get("code")


@contextlib.contextmanager
def running_watcher(server: SimApiServer, settings: Settings) -> Iterator[RunningWatcher]:
    """A Watcher running in a thread of this process (its ApiClient built from a kubeconfig, as in
    production); stopped and joined on exit."""
    with tempfile.TemporaryDirectory() as tmp:
        api = kube.api_client(str(server.write_kubeconfig(Path(tmp) / "kubeconfig")))
    client = redis_client(settings.redis_url)
    watcher = Watcher(settings, api, client)
    result: dict[str, int] = {}

    def run() -> None:
        result["code"] = watcher.run()

    thread = threading.Thread(target=run, name="test-watcher")
    thread.start()
    try:
        yield RunningWatcher(watcher, thread, result)
    finally:
        watcher.stop()
        thread.join(timeout=20)
        api.close()
        client.close()
        assert not thread.is_alive(), "the watcher did not stop"


def caught_up(watcher: Watcher, server: SimApiServer) -> bool:
    """Every watched kind has been applied up to the store's current resourceVersion."""
    rv = server.store.resource_version
    applied = watcher.applied_rv
    return all(kind in applied and int(applied[kind] or 0) >= rv for kind in WATCHED)


def quiescent(client: redis.Redis, shards: int = DEFAULT_SHARDS) -> bool:
    """No dirty id, no lease, no pending candidate, no queued job, in any shard."""
    pipe = client.pipeline(transaction=False)
    for s in range(shards):
        pipe.scard(KEYS.dirty(s))
        pipe.zcard(KEYS.inflight(s))
        pipe.zcard(KEYS.due(s))
        pipe.exists(KEYS.queued(s))
    return not any(pipe.execute())


def dirty_ids(client: redis.Redis, shards: int = DEFAULT_SHARDS) -> set[str]:
    out: set[str] = set()
    for s in range(shards):
        out |= {m.decode() for m in client.smembers(KEYS.dirty(s))}
    return out


def clear_dirty(client: redis.Redis, shards: int = DEFAULT_SHARDS) -> None:
    client.delete(*(KEYS.dirty(s) for s in range(shards)))


def allocation_ids(sim: SimCluster, *, node: str | None = None, ips: set[str] | None = None) -> set[str]:
    """Allocation ids in the store's blocks, by `node` attribute or by IP."""
    out: set[str] = set()
    for raw in sim.store.list("ipamblocks")["items"]:
        for a in parse_block(raw).iter_allocations():
            if (node is not None and a.node == node) or (ips is not None and a.ip in ips):
                out.add(a.id)
    return out


def pod_allocation_ids(sim: SimCluster, ns: str, pod: str) -> set[str]:
    handle, ips = sim.pod_handles[(ns, pod)]
    return {f"{handle}/{ip}" for ip in ips}


def releasable_ips(client: redis.Redis, found: list[Decision]) -> set[str]:
    """The decided IPs that survive handle all-or-none (the leader's gate, #5044): every allocation the
    handle index lists for the handle has a decision."""
    decided = {d.alloc_id for d in found}
    out: set[str] = set()
    for d in found:
        fields = handle_fields(client, KEYS, d.handle)
        ids = {alloc_id_of(d.handle, f.decode()) for f in fields}
        if ids <= decided:
            out.add(d.ip)
    return out


def mirrored_pods(client: redis.Redis) -> set[str]:
    return {f.decode() for f in client.hkeys(KEYS.pods)}


def pod_mirrored(client: redis.Redis, ns: str, name: str) -> bool:
    return bool(client.hexists(KEYS.pods, pod_key(ns, name)))


@dataclass
class Workers:
    procs: list[subprocess.Popen[bytes]]
    logs: list[Path]

    def output(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')}" for p in self.logs if p.exists())


@contextlib.contextmanager
def worker_processes(
    redis_url: str, shard_specs: list[str | None], tmp_path: Path, *extra: str
) -> Iterator[Workers]:
    """`ipamgc work` processes (one per spec: a `--shards` list, or None for all); stopped with SIGTERM,
    killed if they linger, always reaped."""
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[Path] = []
    try:
        for i, spec in enumerate(shard_specs):
            log = tmp_path / f"worker-{i}.log"
            logs.append(log)
            args = [
                sys.executable,
                "-m",
                "ipamgc.commands.work",
                "--redis-url",
                redis_url,
                "--work-lease",
                "2s",
            ]
            args += ["--job-idle", "0.5s"]  # lingering jobs end soon after the work, so tests see quiescence
            args += ["--log-level", "WARNING", "--name", f"test-worker-{os.getpid()}-{i}", *extra]
            if spec is not None:
                args += ["--shards", spec]
            with log.open("wb") as out:
                procs.append(subprocess.Popen(args, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT))
        yield Workers(procs, logs)
    finally:
        stop_processes(procs)


def stop_processes(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)
