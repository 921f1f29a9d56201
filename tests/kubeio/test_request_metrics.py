"""ipamgc's API requests as client-go counts its (kubeio/requestmetrics.py): each request `Http` makes is
counted by verb, resource and status code (`<error>` without an answer) and timed, a watch as `WATCH`;
the collector serves them as `rest_client_requests_total` and `rest_client_request_duration_seconds`."""

from __future__ import annotations

import pytest
from kubernetes import client
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kubeio.http import ApiError, Http
from kubeio.requestmetrics import BUCKETS, RequestCollector, RequestStats, resource_of


@pytest.mark.parametrize(
    ("path", "resource"),
    [
        ("/api/v1/nodes", "nodes"),
        ("/api/v1/nodes/node-1", "nodes"),
        ("/api/v1/namespaces/kube-system", "namespaces"),
        ("/api/v1/namespaces/default/pods", "pods"),
        ("/api/v1/namespaces/default/pods/p-1/status", "pods"),
        ("/apis/crd.projectcalico.org/v1/ipamblocks/10-0-0-0-26", "ipamblocks"),
        ("/apis/coordination.k8s.io/v1/namespaces/ipamgc/leases/ipamgc-leader", "leases"),
        ("/apis/kubevirt.io/v1/namespaces/vms/virtualmachineinstances", "virtualmachineinstances"),
        ("/apis/crd.projectcalico.org/v1", ""),
        ("/apis", ""),
        ("/version", ""),
    ],
)
def test_the_resource_of_a_path(path: str, resource: str) -> None:
    assert resource_of(path) == resource


def _samples(stats: RequestStats) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    registry.register(RequestCollector(stats))
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def test_requests_against_the_api_server_are_counted_and_timed(api: client.ApiClient) -> None:
    stats = RequestStats()
    h = Http(api, stats=stats)
    h.json("GET", "/api/v1/nodes", what="list nodes")
    h.json("GET", "/api/v1/nodes", what="list nodes")
    with pytest.raises(ApiError):
        h.json("GET", "/apis/crd.projectcalico.org/v1/ipamblocks/nope", what="get block nope")
    query = {"watch": "true", "timeoutSeconds": "1"}
    watch = h.stream("GET", "/api/v1/nodes", what="watch nodes", query=query)
    watch.release_conn()
    samples = _samples(stats)
    total = "rest_client_requests_total"
    assert samples[(total, (("code", "200"), ("resource", "nodes"), ("verb", "GET")))] == 2
    assert samples[(total, (("code", "404"), ("resource", "ipamblocks"), ("verb", "GET")))] == 1
    assert samples[(total, (("code", "200"), ("resource", "nodes"), ("verb", "WATCH")))] == 1
    count = "rest_client_request_duration_seconds_count"
    assert samples[(count, (("resource", "nodes"), ("verb", "GET")))] == 2
    inf = "rest_client_request_duration_seconds_bucket"
    assert samples[(inf, (("le", "+Inf"), ("resource", "nodes"), ("verb", "GET")))] == 2
    assert samples[("rest_client_request_duration_seconds_sum", (("resource", "nodes"), ("verb", "GET")))] > 0


def test_no_answer_is_counted_as_error() -> None:
    stats = RequestStats()
    cfg = client.Configuration()
    cfg.host = "http://127.0.0.1:9"  # discard port: nothing listens
    with client.ApiClient(cfg) as api, pytest.raises(ApiError):
        Http(api, timeout=(1.0, 1.0), stats=stats).json("PUT", "/api/v1/nodes/x", what="put node x")
    assert stats.counts() == {("PUT", "nodes", "<error>"): 1}


def test_the_histogram_buckets_are_cumulative_with_clientgos_bounds() -> None:
    stats = RequestStats()
    for seconds in (0.001, 0.005, 0.02, 0.3, 100.0):
        stats.record("PUT", "/apis/crd.projectcalico.org/v1/ipamblocks/b", 200, seconds)
    samples = _samples(stats)
    labels = (("resource", "ipamblocks"), ("verb", "PUT"))
    bucket = "rest_client_request_duration_seconds_bucket"
    got = [samples[(bucket, (("le", repr(b)), *labels))] for b in BUCKETS]
    assert got == [2, 3, 3, 3, 4, 4, 4, 4, 4, 4, 4, 4]  # le 0.005 holds 0.005 itself
    assert samples[(bucket, (("le", "+Inf"), *labels))] == 5
    assert samples[("rest_client_request_duration_seconds_sum", labels)] == pytest.approx(100.326)
