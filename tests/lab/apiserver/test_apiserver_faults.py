"""The simulated API server's fault injection over real HTTP: error codes, 429 with Retry-After, latency,
dropped watches, forced 410s, the control endpoint, and a reproducible injector."""

from __future__ import annotations

import time
import urllib.request

import pytest
import urllib3
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from lab.apiserver.apiserver import SimApiServer
from lab.apiserver.faults import FaultInjector, FaultRule
from tests.lab.apiserver.apiserver_helpers import http, pod, raw_watch, status_of

# -- fault injection --------------------------------------------------------------------------------


@pytest.mark.parametrize(("code", "reason"), [(500, "InternalError"), (503, "ServiceUnavailable")])
def test_fault_error_codes(core: client.CoreV1Api, server: SimApiServer, code: int, reason: str) -> None:
    server.faults.add(verbs={"list"}, resources={"pods"}, error_rate=1.0, error_code=code)
    with pytest.raises(ApiException) as err:
        core.list_namespaced_pod("default")
    assert err.value.status == code and status_of(err.value)["reason"] == reason
    assert core.list_node().items == []  # other resources are unaffected
    assert server.find_requests(resource="pods", status=code)[0].fault == f"error={code}"


def test_fault_429_has_retry_after(core: client.CoreV1Api, server: SimApiServer) -> None:
    server.faults.add(verbs={"create"}, error_rate=1.0, error_code=429, retry_after=3, times=1)
    with pytest.raises(ApiException) as err:
        core.create_node({"metadata": {"name": "n1"}})
    assert err.value.status == 429 and err.value.headers["Retry-After"] == "3"
    body = status_of(err.value)
    assert body["reason"] == "TooManyRequests" and body["details"]["retryAfterSeconds"] == 3
    assert core.create_node({"metadata": {"name": "n1"}}).metadata.name == "n1"  # times=1: spent

    # like against a real server, urllib3 honours Retry-After on an idempotent GET by retrying
    server.faults.add(verbs={"get"}, error_rate=1.0, error_code=429, retry_after=1, times=1)
    start = time.monotonic()
    assert core.read_node("n1").metadata.name == "n1"
    assert time.monotonic() - start >= 1
    assert [r.status for r in server.find_requests(verb="get")] == [429, 200]


def test_fault_latency(core: client.CoreV1Api, server: SimApiServer) -> None:
    server.faults.add(verbs={"list"}, resources={"nodes"}, latency=0.3)
    start = time.monotonic()
    core.list_node()
    assert time.monotonic() - start >= 0.3


def test_fault_drops_watch_after_n_events(core: client.CoreV1Api, server: SimApiServer) -> None:
    for name in ("a", "b", "c"):
        server.store.create("pods", "default", pod(name))
    server.faults.add(verbs={"watch"}, resources={"pods"}, drop_watch_after=2)
    seen = []
    with pytest.raises(urllib3.exceptions.ProtocolError):
        for event in watch.Watch().stream(core.list_namespaced_pod, "default", timeout_seconds=5):
            seen.append(event["object"].metadata.name)
    assert seen == ["a", "b"]

    server.faults.clear()
    server.faults.add(verbs={"watch"}, drop_watch_rate=1.0)
    with pytest.raises(urllib3.exceptions.ProtocolError):
        list(watch.Watch().stream(core.list_namespaced_pod, "default", timeout_seconds=5))


def test_fault_forced_410(core: client.CoreV1Api, server: SimApiServer) -> None:
    for i in range(3):
        server.store.create("pods", "default", pod(f"p{i}"))
    rv = str(server.store.resource_version)
    server.faults.add(verbs={"watch"}, expire=True, times=1)
    with raw_watch(core.list_namespaced_pod, "default", resource_version=rv, timeout_seconds=1) as events:
        got = list(events)
    assert [(e["type"], e["object"]["code"]) for e in got] == [("ERROR", 410)]
    with raw_watch(core.list_namespaced_pod, "default", resource_version=rv, timeout_seconds=1) as events:
        assert list(events) == []

    server.faults.add(verbs={"list"}, expire=True, times=1)
    first = core.list_namespaced_pod("default", limit=1)  # not a continue: unaffected
    with pytest.raises(ApiException) as err:
        core.list_namespaced_pod("default", limit=1, _continue=first.metadata._continue)
    assert err.value.status == 410
    assert len(core.list_namespaced_pod("default", limit=1, _continue=first.metadata._continue).items) == 1


def test_fault_control_endpoint(core: client.CoreV1Api, server: SimApiServer) -> None:
    reply = http(
        server,
        "POST",
        "/_sim/faults",
        {"action": "add", "rule": {"verb": "list", "resource": "nodes", "error_rate": 1, "error_code": 503}},
    )
    assert reply["rules"][0]["verbs"] == ["list"] and reply["rules"][0]["error_code"] == 503
    with pytest.raises(ApiException) as err:
        core.list_node()
    assert err.value.status == 503
    assert len(http(server, "GET", "/_sim/faults")["rules"]) == 1
    http(server, "DELETE", "/_sim/faults")
    assert server.faults.rules == []
    core.list_node()
    with pytest.raises(urllib.error.HTTPError) as bad:
        http(server, "POST", "/_sim/faults", {"action": "add", "rule": {"verbs": ["fly"]}})
    assert bad.value.code == 400
    bad.value.close()
    assert http(server, "GET", "/_sim/requests?resource=nodes")["items"][0]["verb"] == "list"


def test_fault_injector_is_reproducible() -> None:
    def outcomes(seed: int) -> list[int | None]:
        inj = FaultInjector(seed)
        inj.add(FaultRule(error_rate=0.5))
        return [inj.decide("get", "pods").error_code for _ in range(50)]

    assert outcomes(7) == outcomes(7)
    assert None in outcomes(7) and 500 in outcomes(7)
    assert FaultRule.from_json({"verb": "watch", "drop_watch_after": 3}).verbs == frozenset({"watch"})
    with pytest.raises(ValueError, match="error_code"):
        FaultRule(error_code=404)
