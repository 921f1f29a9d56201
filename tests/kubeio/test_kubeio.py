"""`kubeio`: raw JSON requests over the client's configuration, and the Lease candidate, against the
simulated API server over HTTP (and, for interoperation, the official client's own election)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

from kubeio.http import CREDENTIALS_REUSE_SECONDS, ApiError, Http
from kubeio.lease import Lease
from lab.apiserver.apiserver import SimApiServer

NS, NAME = "kube-system", "kubeio-test"


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def lease_requests(server: SimApiServer, agent: str) -> list[tuple[str, int]]:
    return [
        (r.verb, r.status)
        for r in server.request_log.records()
        if r.resource == "leases" and r.user_agent == agent
    ]


def candidate(
    server: SimApiServer, api: client.ApiClient, who: str, clock: FakeClock, seconds: int = 15
) -> Lease:
    api.user_agent = who
    return Lease(Http(api), namespace=NS, name=NAME, identity=who, lease_seconds=seconds, monotonic=clock)


@pytest.fixture
def two(server: SimApiServer) -> Iterator[tuple[client.ApiClient, client.ApiClient]]:
    with server.api_client() as a, server.api_client() as b:
        yield a, b


def holder(coord: client.CoordinationV1Api) -> Any:
    return coord.read_namespaced_lease(NAME, NS).spec


def test_creates_the_lease_then_renews_it_with_one_conditional_put(
    server: SimApiServer, api: client.ApiClient, coord: client.CoordinationV1Api
) -> None:
    clock = FakeClock()
    me = candidate(server, api, "me", clock)
    assert me.try_acquire_or_renew()
    spec = holder(coord)
    assert spec.holder_identity == "me" and spec.lease_duration_seconds == 15
    assert spec.lease_transitions == 0 and spec.acquire_time is not None
    first_renew = spec.renew_time
    server.request_log.clear()
    for _ in range(3):
        clock.t += 2
        assert me.try_acquire_or_renew()
    # Holding it: each renewal is one PUT (client-go's fast path), no read.
    assert lease_requests(server, "me") == [("update", 200)] * 3
    assert holder(coord).renew_time > first_renew


def test_another_holder_is_respected_until_its_record_is_unchanged_for_the_lease_duration(
    server: SimApiServer, two: tuple[client.ApiClient, client.ApiClient], coord: client.CoordinationV1Api
) -> None:
    clock = FakeClock()
    a, b = candidate(server, two[0], "a", clock, 10), candidate(server, two[1], "b", clock, 10)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew() and b.observed_holder == "a"
    clock.t += 9.5
    assert a.try_acquire_or_renew()  # a renews: b sees a new record and restarts its count
    clock.t += 9.5
    assert not b.try_acquire_or_renew()
    clock.t += 9.5  # a stopped renewing 9.5 s ago, b saw that record 9.5 s ago: not yet
    assert not b.try_acquire_or_renew()
    clock.t += 0.6  # unchanged for 10.1 s on b's clock: expired, b takes it
    assert b.try_acquire_or_renew()
    spec = holder(coord)
    assert spec.holder_identity == "b" and spec.lease_transitions == 1
    # a's fast-path renewal now fails (409: b wrote it), a reads it and sees b's fresh record.
    assert not a.try_acquire_or_renew() and a.observed_holder == "b"


def test_of_two_racing_candidates_one_wins(
    server: SimApiServer, two: tuple[client.ApiClient, client.ApiClient], coord: client.CoordinationV1Api
) -> None:
    clock = FakeClock()
    a, b = candidate(server, two[0], "a", clock), candidate(server, two[1], "b", clock)
    assert a.try_acquire_or_renew()
    assert a.release() and holder(coord).holder_identity in ("", None)
    # Both read the released Lease; only the first conditional PUT goes through.
    read = Http(two[0]).json("GET", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{NAME}", what="get")
    assert b.try_acquire_or_renew()
    stale = {**read, "spec": {**read["spec"], "holderIdentity": "a"}}
    with pytest.raises(ApiError) as err:
        Http(two[0]).json(
            "PUT", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{NAME}", what="put", body=stale
        )
    assert err.value.status == 409
    assert holder(coord).holder_identity == "b"


def test_release_empties_the_holder_and_a_standby_takes_over_at_once(
    server: SimApiServer, two: tuple[client.ApiClient, client.ApiClient], coord: client.CoordinationV1Api
) -> None:
    clock = FakeClock()
    a, b = candidate(server, two[0], "a", clock), candidate(server, two[1], "b", clock)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    assert a.release()
    assert not a.release()  # nothing more to give up
    assert b.try_acquire_or_renew()  # no wait for expiry: the holder is empty
    assert holder(coord).holder_identity == "b"


def official_candidate(api: client.ApiClient, identity: str) -> Any:
    """A candidate of the official client's `kubernetes.leaderelection`, on `api`."""
    lock = LeaseLock(NAME, NS, identity)
    lock.api_instance = client.CoordinationV1Api(api)
    config = electionconfig.Config(
        lock,
        lease_duration=15,
        renew_deadline=10,
        retry_period=2,
        onstarted_leading=lambda: None,
        onstopped_leading=lambda: None,
    )
    return leaderelection.LeaderElection(config)


def test_interoperates_with_the_official_clients_election(
    server: SimApiServer, api: client.ApiClient, coord: client.CoordinationV1Api
) -> None:
    """A rolling upgrade mixes candidates: a Lease held by kubernetes.leaderelection is respected, and
    one written by us reads as held to it."""
    official = official_candidate(api, "official")
    assert official.try_acquire_or_renew()
    with server.api_client() as other:
        ours = candidate(server, other, "ours", FakeClock())
        assert not ours.try_acquire_or_renew() and ours.observed_holder == "official"
    coord.delete_namespaced_lease(NAME, NS)
    with server.api_client() as other:
        ours = candidate(server, other, "ours", FakeClock())
        assert ours.try_acquire_or_renew()
    second = official_candidate(api, "official-2")
    assert not second.try_acquire_or_renew()
    assert holder(coord).holder_identity == "ours"


def test_errors_carry_the_status_and_one_line(api: client.ApiClient) -> None:
    h = Http(api)
    with pytest.raises(ApiError) as err:
        h.json("GET", "/apis/crd.projectcalico.org/v1/ipamblocks/nope", what="get block nope")
    assert err.value.status == 404
    assert str(err.value).startswith("get block nope: HTTP 404: Not Found") and "\n" not in str(err.value)


def test_no_answer_is_status_zero() -> None:
    cfg = client.Configuration()
    cfg.host = "http://127.0.0.1:9"  # discard port: nothing listens
    with client.ApiClient(cfg) as api, pytest.raises(ApiError) as err:
        Http(api, timeout=(1.0, 1.0)).json("GET", "/api/v1/nodes/x", what="get node x")
    assert err.value.status == 0 and str(err.value).startswith("get node x: ")


def test_the_bearer_token_and_user_agent_come_from_the_clients_configuration() -> None:
    """Read from `Configuration.auth_settings()` (where a rotated token appears), at most once every
    CREDENTIALS_REUSE_SECONDS, and again at once after a 401."""
    seen: list[dict[str, str]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(dict(self.headers))
            refused = self.headers.get("authorization") == "Bearer revoked"
            body = b'{"kind":"Status","code":401}' if refused else b'{"kind":"Node"}'
            self.send_response(401 if refused else 200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    now = [100.0]
    try:
        cfg = client.Configuration()
        cfg.host = f"http://127.0.0.1:{httpd.server_address[1]}/prefix"
        cfg.api_key = {"authorization": "first"}
        cfg.api_key_prefix = {"authorization": "Bearer"}
        with client.ApiClient(cfg) as api:
            api.user_agent = "ipamgc-test"
            h = Http(api, clock=lambda: now[0])
            assert h.json("GET", "/api/v1/nodes/x", what="get")["kind"] == "Node"
            cfg.api_key = {"authorization": "rotated"}
            h.json("GET", "/api/v1/nodes/x", what="get")  # within the reuse window: the one read before
            now[0] += CREDENTIALS_REUSE_SECONDS
            h.json("GET", "/api/v1/nodes/x", what="get")  # read again
            cfg.api_key = {"authorization": "revoked"}
            now[0] += CREDENTIALS_REUSE_SECONDS
            with pytest.raises(ApiError) as refused:
                h.json("GET", "/api/v1/nodes/x", what="get")
            assert refused.value.status == 401
            cfg.api_key = {"authorization": "renewed"}
            h.json("GET", "/api/v1/nodes/x", what="get")  # after a 401: read at once, no window
    finally:
        httpd.shutdown()
        httpd.server_close()
    tokens = [s.get("authorization") for s in seen]
    assert tokens == ["Bearer first", "Bearer first", "Bearer rotated", "Bearer revoked", "Bearer renewed"]
    assert all(s.get("User-Agent") == "ipamgc-test" for s in seen)


def test_a_pool_closed_since_is_looked_up_again(api: client.ApiClient) -> None:
    """The host's pool is looked up once and kept; a pool closed since (the manager evicts and closes
    pools) answers ClosedPoolError, and the request goes to the manager's new pool rather than failing."""
    h = Http(api)
    assert h.json("GET", "/api/v1/nodes", what="list nodes")["kind"] == "NodeList"
    first = api.rest_client.pool_manager.connection_from_url(api.configuration.host)
    first.close()  # as an eviction does; urllib3 2's `clear()` drops its pools without closing them
    api.rest_client.pool_manager.clear()
    assert h.json("GET", "/api/v1/nodes", what="list nodes")["kind"] == "NodeList"
    assert api.rest_client.pool_manager.connection_from_url(api.configuration.host) is not first
