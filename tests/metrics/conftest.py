"""Metrics fixtures: the session's real Redis, the simulated cluster over HTTP, and a watcher running in a
thread with its `WatcherMetrics` attached before it starts (so the tally sees the first relist), plus an
independent computation of Calico's gauges from the simulated store to compare against."""

from __future__ import annotations

import contextlib
import ipaddress
import tempfile
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from lab.apiserver.apiserver import SimApiServer
from lab.apiserver.store import Store
from producer import kube
from producer.metrics import WatcherMetrics
from producer.watcher import Watcher
from redisio.client import redis_client
from shared.config import Settings
from shared.parse import parse_block
from tests.e2e import conftest as e2e

redis_endpoint = e2e.redis_endpoint
client = e2e.client
redis_url = e2e.redis_url
server = e2e.server
sim = e2e.sim

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def metric_samples(collector: WatcherMetrics) -> Samples:
    """Every sample a collector yields, as {(name, sorted labels): value}."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value for fam in collector.collect() for s in fam.samples
    }


@dataclass
class Running:
    watcher: Watcher
    metrics: WatcherMetrics
    thread: threading.Thread

    def samples(self) -> Samples:
        return metric_samples(self.metrics)

    def family(self, name: str) -> dict[tuple[str, ...], float]:
        """Samples of one family keyed by their label values (in label-name order)."""
        return {
            tuple(v for _, v in labels): value for (n, labels), value in self.samples().items() if n == name
        }


@contextlib.contextmanager
def watcher_with_metrics(
    srv: SimApiServer, settings: Settings, interval: float = 3600.0
) -> Iterator[Running]:
    """A Watcher in a thread of this process with its metrics attached first; stopped on exit."""
    with tempfile.TemporaryDirectory() as tmp:
        api = kube.api_client(str(srv.write_kubeconfig(Path(tmp) / "kubeconfig")))
    conn = redis_client(settings.redis_url)
    watcher = Watcher(settings, api, conn)
    metrics = WatcherMetrics(watcher, None, interval=interval)
    thread = threading.Thread(target=watcher.run, name="test-watcher")
    thread.start()
    metrics.start()
    try:
        yield Running(watcher, metrics, thread)
    finally:
        metrics.stop()
        watcher.stop()
        thread.join(timeout=20)
        api.close()
        conn.close()
        assert not thread.is_alive(), "the watcher did not stop"


def expected_gauges(store: Store) -> dict[str, Counter[tuple[str, str]]]:
    """Calico's in_use, borrowed and blocks per (pool, node), computed from scratch from the store."""
    pools = [
        (p["metadata"]["name"], ipaddress.ip_network(p["spec"]["cidr"]))
        for p in store.list("ippools")["items"]
        if not p["metadata"].get("deletionTimestamp")
    ]
    out: dict[str, Counter[tuple[str, str]]] = {
        "in_use": Counter(),
        "borrowed": Counter(),
        "blocks": Counter(),
    }
    for raw in store.list("ipamblocks")["items"]:
        block = parse_block(raw)
        if block.deleted:
            continue
        net = ipaddress.ip_network(block.cidr_str)
        pool = next(
            (n for n, p in pools if p.version == net.version and net.subnet_of(p)),  # type: ignore[arg-type]
            "no_ippool",
        )
        out["blocks"][(pool, block.host or "no_affinity")] += 1
        for a in block.iter_allocations():
            out["in_use"][(pool, a.node or "unknown_node")] += 1
            if a.node and a.node != block.host:
                out["borrowed"][(pool, a.node)] += 1
    return out
