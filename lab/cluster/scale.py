"""How big a cluster the simulator holds on these machines, and how fast (`ipamgc sim scale`).

Loads N nodes and P pods in bulk, lists every pod through the official client with `limit`/`continue`
over real HTTP, then churns pod events at a fixed rate while a client watches all pods, and reports
what it measured (wall times, achieved event rate, watch events seen, CPU of this process).
"""

from __future__ import annotations

import resource
import threading
import time
from typing import Any

import orjson
from kubernetes import client as k8s
from urllib3.exceptions import ProtocolError

from lab.apiserver.apiserver import SimApiServer
from lab.apiserver.store import Store
from lab.cluster.churn import Churn
from lab.cluster.cluster import SimCluster


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def measure(
    nodes: int, pods_per_node: int, churn_rate: float, duration: float, page: int, seed: int
) -> dict[str, Any]:
    out: dict[str, Any] = {"nodes": nodes, "pods": nodes * pods_per_node}
    store = Store(seed=seed)
    cluster = SimCluster(store, seed=seed)
    t0, c0 = time.monotonic(), _cpu()
    cluster.bootstrap()
    cluster.bulk_populate(nodes, pods_per_node)
    out["load_seconds"] = round(time.monotonic() - t0, 2)
    out["load_cpu_seconds"] = round(_cpu() - c0, 2)
    with SimApiServer(store) as server, k8s.ApiClient(server.client_configuration()) as api:
        core = k8s.CoreV1Api(api)
        t0 = time.monotonic()
        seen, pages, token = 0, 0, None
        while True:
            resp: Any = core.list_pod_for_all_namespaces(limit=page, _continue=token, _preload_content=False)
            body = orjson.loads(resp.data)
            resp.release_conn()
            seen += len(body["items"])
            pages += 1
            token = body["metadata"].get("continue")
            if not token:
                break
        out["list_pods_paginated_seconds"] = round(time.monotonic() - t0, 2)
        out["list_pods_items"] = seen
        out["list_pods_pages"] = pages
        rv = body["metadata"]["resourceVersion"]

        watched = {"events": 0}
        stop = threading.Event()

        def watch() -> None:
            resp: Any = core.list_pod_for_all_namespaces(
                watch=True, resource_version=rv, timeout_seconds=int(duration) + 30, _preload_content=False
            )
            try:
                for line in resp.stream(amt=None):
                    watched["events"] += line.count(b"\n")
                    if stop.is_set():
                        break
            except ProtocolError:
                pass  # the server dropped the watch at the end of the measurement
            finally:
                resp.close()
                resp.release_conn()

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        churn = Churn(cluster, churn_rate, leak_rate=0.05, seed=seed)
        t0, c0 = time.monotonic(), _cpu()
        stats = churn.run(duration)
        elapsed = time.monotonic() - t0
        stop.set()
        out["churn_target_per_second"] = churn_rate
        out["churn_events"] = stats.events
        out["churn_achieved_per_second"] = round(stats.events / elapsed, 1)
        out["churn_errors"] = stats.errors
        out["churn_cpu_seconds_per_second"] = round((_cpu() - c0) / elapsed, 2)
        out["watch_events_during_churn"] = watched["events"]
        server.drop_watches()
        watcher.join(timeout=10)
    out["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return out
