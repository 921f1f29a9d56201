"""ipamgc's own API requests, counted as client-go counts its: `rest_client_requests_total{verb, resource,
code}` and `rest_client_request_duration_seconds{verb, resource}`.

Why: an API server that throttles (429) or fails (5xx) ipamgc's requests was invisible; client-go programs
expose these two series, and dashboards and alerts for them exist.  Every request `kubeio.http.Http` makes
(the watcher's lists and watches, both Lease loops, the leader's reads and conditional writes) is recorded
here once, when its status line is in (a watch: when the stream opens, as client-go times it).

Labels: `verb` is the HTTP method, `WATCH` for a watch; `resource` the path's resource (`pods`,
`ipamblocks`, `leases`; "" for discovery); `code` the status, `<error>` when no answer came (client-go's
word).  Recording is a dict lookup (the path's resource, remembered), a bisect and one row's increments
under an uncontended lock, no prometheus-client call per request; the families are built at scrape by
`RequestCollector`.  docs/operations.md gives the cost, measured.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from shared import metrics_names as m

REQUESTS = m.REST_REQUESTS  # counter {verb, resource, code}
DURATION = m.REST_DURATION  # histogram {verb, resource}
# client-go's buckets for rest_client_request_duration_seconds (k8s.io/client-go/tools/metrics)
BUCKETS = (0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0)
NO_ANSWER = "<error>"
_CODES = {n: str(n) for n in range(100, 600)}
# path → resource, remembered: the paths a process requests repeat (its Leases, list and watch paths, the
# blocks it writes); cleared when full, so that per-object paths (pods by name) cannot grow it for ever.
_RESOURCES: dict[str, str] = {}
_RESOURCES_MAX = 4096


def resource_of(path: str) -> str:
    """`/api/v1/namespaces/ns/pods/x` → `pods`; `/apis/g/v/ipamblocks` → `ipamblocks`; "" otherwise."""
    if path.startswith("/api/v1/"):
        start = 8
    elif path.startswith("/apis/"):
        version = path.find("/", path.find("/", 6) + 1)
        if version < 0:
            return ""
        start = version + 1
    else:
        return ""
    if path.startswith("namespaces/", start):
        after = path.find("/", start + 11)
        if after < 0:
            return "namespaces"
        start = after + 1
    end = path.find("/", start)
    return path[start:] if end < 0 else path[start:end]


def _remember(path: str) -> str:
    if len(_RESOURCES) >= _RESOURCES_MAX:
        _RESOURCES.clear()
    resource = _RESOURCES[path] = resource_of(path)
    return resource


class RequestStats:
    """The counts and latencies of one process's API requests (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # (verb, resource, status) → per-bucket counts (not cumulative; the last one +Inf), then the sum
        self._rows: dict[tuple[str, str, int], list[float]] = {}

    def record(self, verb: str, path: str, status: int, seconds: float) -> None:
        """One request: `status` 0 when no answer came."""
        resource = _RESOURCES.get(path)
        if resource is None:
            resource = _remember(path)
        slot = bisect_left(BUCKETS, seconds)
        key = (verb, resource, status)
        with self._lock:
            row = self._rows.get(key)
            if row is None:
                row = self._rows[key] = [0.0] * (len(BUCKETS) + 2)
            row[slot] += 1
            row[-1] += seconds

    def counts(self) -> dict[tuple[str, str, str], int]:
        """(verb, resource, code) → requests."""
        out: dict[tuple[str, str, str], int] = {}
        for (verb, resource, status), row in self._snapshot().items():
            key = (verb, resource, _CODES.get(status, NO_ANSWER))
            out[key] = out.get(key, 0) + int(sum(row[:-1]))
        return out

    def latencies(self) -> dict[tuple[str, str], list[float]]:
        """(verb, resource) → per-bucket counts, then the sum of seconds (every status together)."""
        out: dict[tuple[str, str], list[float]] = {}
        for (verb, resource, _status), row in self._snapshot().items():
            acc = out.setdefault((verb, resource), [0.0] * len(row))
            for i, value in enumerate(row):
                acc[i] += value
        return out

    def _snapshot(self) -> dict[tuple[str, str, int], list[float]]:
        with self._lock:
            return {k: list(v) for k, v in self._rows.items()}


#: The process's requests: every `Http` records here unless given its own.
PROCESS = RequestStats()


class RequestCollector(Collector):
    """`stats` as client-go's two families, built at scrape."""

    def __init__(self, stats: RequestStats = PROCESS) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        doc = "ipamgc's API requests, by verb, resource and status code."
        requests = CounterMetricFamily(REQUESTS, doc, labels=["verb", "resource", "code"])
        for (verb, resource, code), n in sorted(self.stats.counts().items()):
            requests.add_metric([verb, resource, code], n)
        yield requests
        duration = HistogramMetricFamily(
            DURATION, "ipamgc's API request latency (a watch: until it opens).", labels=["verb", "resource"]
        )
        for (verb, resource), hist in sorted(self.stats.latencies().items()):
            cumulative = 0.0
            buckets = []
            for bound, count in zip((*BUCKETS, float("inf")), hist[:-1], strict=True):
                cumulative += count
                buckets.append((_bound(bound), cumulative))
            duration.add_metric([verb, resource], buckets, hist[-1])
        yield duration


def _bound(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))
