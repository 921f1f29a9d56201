"""`ipamgc bench --leaked-handles N`: how long the leader's handle collector takes to clean N leaked
IPAMHandles (docs/handles.md), how many API requests, and how much of the leader's CPU.

Why a module of its own: the main bench (`lab/bench/run.py`) measures the watcher-to-leader flow under
churn with real processes and a real clock; cleaning #8548's 30,000 leaked handles takes the grace period
twice plus the rate-limited writes, an hour of wall time.  So this scenario runs the real leader (`Leader`,
its handle collector, its HTTP client against the simulated API server, a real redis-server) in-process
and steps it on a virtual clock: the clock moves by the wait each pass asks for, and the rate limit's
token bucket reads the same clock.  The virtual time is what a deployed leader would take at that rate
limit; the leader's own CPU (its thread's CPU time, the simulated server's excluded) and the requests it
made are measured for real.  The leaked handles are the shape #8548 reports: IPAMHandles still counting an
address in a block that holds nothing for them (a CNI that crashed between its handle and block writes),
so each one is emptied and, one window later, deleted.
"""

from __future__ import annotations

import itertools
import random
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubeio.election import Leadership
from lab.apiserver.apiserver import SimApiServer
from lab.apiserver.resources import resources_for
from lab.apiserver.store import Store
from lab.chaos.redisproc import RedisProcess
from lab.cluster.cluster import SimCluster
from producer.mirror import Mirror
from producer.relist import Kind
from redisio.client import redis_client
from shared.calicogroup import V1
from shared.clock import FakeClock
from shared.config import Settings
from shared.consistency import handle_divergences
from shared.parse import parse_block, parse_handle, parse_node, parse_pod
from workers.leader import kube
from workers.leader.loop import Leader
from workers.leader.settings import LeaderSettings

GRACE = 900.0  # Calico's default leak grace period
LEAKED_PREFIX = "k8s-pod-network.leaked-"


def _leak(store: Store, count: int, seed: int) -> None:
    """`count` IPAMHandles counting one address each in a real block that holds nothing for them."""
    cidrs = sorted(str(b["spec"]["cidr"]) for b in store.list("ipamblocks")["items"])
    rng = random.Random(seed)
    for i in range(count):
        handle = f"{LEAKED_PREFIX}{i:08d}"
        body = {
            "apiVersion": V1.api_version,
            "kind": "IPAMHandle",
            "metadata": {"name": handle},
            "spec": {"handleID": handle, "block": {rng.choice(cidrs): 1}, "deleted": False},
        }
        store.create("ipamhandles", None, body)


def _mirror(store: Store, client: Any, settings: Settings, clock: FakeClock) -> None:
    """The watcher's part, once: the mirror synced, so that the leader's passes run."""
    mirror = Mirror(client, settings.keys, clock=clock)
    mirror.set_config(GRACE, True)
    mirror.relist(Kind.NODES, [parse_node(o) for o in store.list("nodes")["items"]])
    mirror.relist(Kind.PODS, [parse_pod(o) for o in store.list("pods")["items"]])
    mirror.relist(Kind.BLOCKS, [parse_block(o) for o in store.list("ipamblocks")["items"]])
    mirror.mark_synced()


def _divergent(store: Store) -> int:
    blocks = [parse_block(o) for o in store.list("ipamblocks")["items"]]
    handles = {h.name: h for h in (parse_handle(o) for o in store.list("ipamhandles")["items"])}
    return len(handle_divergences(blocks, handles))


def run_handle_bench(
    pods: int,
    leaked: int,
    *,
    nodes: int = 100,
    rate_limit: float = 50.0,
    seed: int = 0,
    say: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Build the cluster, leak `leaked` handles, and step the leader until none diverges; the report."""
    store = Store(resources_for(V1), seed=seed)
    clock = FakeClock()
    with tempfile.TemporaryDirectory(prefix="ipamgc-bench-handles-") as tmp, SimApiServer(store) as server:
        rp = RedisProcess(Path(tmp) / "redis.log")
        rp.start()
        client = redis_client(rp.url)
        api_client = server.api_client()
        try:
            sim = SimCluster(store, seed=seed)
            sim.bootstrap()
            t0 = time.monotonic()
            sim.bulk_populate(nodes, max(1, pods // nodes))
            _leak(store, leaked, seed)
            handles_before = store.count("ipamhandles")
            say(
                f"cluster: {sim.pod_count()} pods, {handles_before} handles ({leaked} leaked) in "
                f"{time.monotonic() - t0:.1f}s"
            )
            base = Settings(redis_url=rp.url)
            _mirror(store, client, base, clock)
            settings = LeaderSettings(base=base, rate_limit=rate_limit, handle_gc=True)
            api_client.user_agent = "ipamgc-leader/bench"
            lead = Leader(
                settings,
                client,
                kube.CalicoApi(api_client),
                Leadership.granted("bench"),
                clock=clock,
                monotonic=clock.now,
            )
            lead.start()
            server.clear_requests()
            requests: Counter[str] = Counter()
            start_virtual, start_wall, start_cpu = clock.now(), time.monotonic(), time.thread_time()
            scan_cpu: list[float] = []
            scan_at: list[float] = []
            passes = 0
            done_at: float | None = None
            while done_at is None:
                scans = lead.handles.scans
                cpu = time.thread_time()
                wait = lead.step()
                if lead.handles.scans != scans:
                    scan_cpu.append(time.thread_time() - cpu)
                    scan_at.append(clock.now())
                passes += 1
                for r in server.requests:
                    requests[f"{r.verb} {r.resource}"] += 1
                server.clear_requests()
                cleaned = passes % 50 == 0 and store.count("ipamhandles") == handles_before - leaked
                if cleaned and _divergent(store) == 0:
                    done_at = clock.now()
                    break
                clock.advance(max(wait, 0.001))
                if clock.now() - start_virtual > 6 * 3600:
                    raise RuntimeError("the leaked handles were not cleaned within 6 virtual hours")
            wall = time.monotonic() - start_wall
            cpu_total = time.thread_time() - start_cpu
            repaired = lead.metrics.handle_gc.repaired
            report = {
                "pods": sim.pod_count(),
                "nodes": nodes,
                "blocks": store.count("ipamblocks"),
                "handles_before": handles_before,
                "leaked": leaked,
                "handles_after": store.count("ipamhandles"),
                "rate_limit": rate_limit,
                "grace_seconds": GRACE,
                "scan_interval_seconds": settings.handle_gc_interval_seconds,
                "scan_gaps_seconds": [round(b - a) for a, b in itertools.pairwise(scan_at)],
                "virtual_seconds_to_clean": round(done_at - start_virtual, 1),
                "leader_passes": passes,
                "scans": lead.handles.scans,
                "scan_cpu_seconds_mean": round(sum(scan_cpu) / max(1, len(scan_cpu)), 3),
                "leader_cpu_seconds": round(cpu_total, 2),
                "wall_seconds": round(wall, 1),
                "emptied": int(repaired.labels("orphan", "empty")._value.get()),
                "deleted": int(repaired.labels("orphan", "delete")._value.get()),
                "requests": dict(sorted(requests.items())),
                "requests_total": sum(requests.values()),
            }
            return report
        finally:
            api_client.close()  # type: ignore[no-untyped-call]
            client.close()
            rp.stop()


def table(report: dict[str, Any]) -> str:
    """The report as a few lines for a terminal."""
    r = report
    minutes = r["virtual_seconds_to_clean"] / 60
    return "\n".join(
        [
            f"{r['leaked']} leaked IPAMHandles at {r['pods']} pods ({r['blocks']} blocks, "
            f"{r['handles_before']} handles): clean after {minutes:.1f} min at {r['rate_limit']:g}/s "
            f"(grace {r['grace_seconds']:g}s, scans {r['scan_gaps_seconds']}s apart)",
            f"writes: {r['emptied']} emptied, {r['deleted']} deleted; {r['requests_total']} API requests: "
            + ", ".join(f"{k} {v}" for k, v in r["requests"].items()),
            f"leader CPU {r['leader_cpu_seconds']}s in all ({r['scans']} scans, "
            f"{r['scan_cpu_seconds_mean']}s each; {r['leader_passes']} passes); wall {r['wall_seconds']}s",
        ]
    )
