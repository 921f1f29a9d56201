"""The simulated API server over real HTTP, watches: history replay, bookmarks, compaction (410), the
watch-list initial events, timeouts, custom objects, stopping, and a shared informer across a restart."""

from __future__ import annotations

import contextlib
import json
import threading
import time

import pytest
import urllib3
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from kubernetes.informer.informer import SharedInformer
from kubernetes.watch.watch import iter_resp_lines

from lab.apiserver.apiserver import SimApiServer
from lab.apiserver.store import SimApiError, Store
from tests.lab.apiserver.apiserver_helpers import CALICO, block, pod, raw_watch, take
from tests.polling import wait_until

# -- watches ----------------------------------------------------------------------------------------


def test_watch_replays_history_in_order(core: client.CoreV1Api, server: SimApiServer) -> None:
    store = server.store
    store.create("pods", "default", pod("old"))
    rv0 = str(store.resource_version)
    store.create("pods", "default", pod("p1"))
    store.patch("pods", "default", "p1", {"metadata": {"labels": {"v": "2"}}})
    store.delete("pods", "default", "p1")
    store.create("nodes", None, {"metadata": {"name": "n1"}})  # another resource: not delivered
    w = watch.Watch()
    events = list(w.stream(core.list_namespaced_pod, "default", resource_version=rv0, timeout_seconds=1))
    assert [(e["type"], e["object"].metadata.name) for e in events] == [
        ("ADDED", "p1"),
        ("MODIFIED", "p1"),
        ("MODIFIED", "p1"),  # a pod's delete: marked (deletionTimestamp, grace 0), then gone
        ("DELETED", "p1"),
    ]
    rvs = [int(e["raw_object"]["metadata"]["resourceVersion"]) for e in events]
    assert rvs == sorted(rvs) and len(set(rvs)) == 4
    assert events[3]["object"].metadata.labels == {"v": "2"}  # the last state, new version
    assert events[3]["object"].metadata.deletion_timestamp is not None
    assert isinstance(events[0]["object"], client.V1Pod)


def test_watch_without_version_starts_with_current_state(
    core: client.CoreV1Api, server: SimApiServer
) -> None:
    for name in ("a", "b", "c"):
        server.store.create("pods", "default", pod(name))
    server.store.ensure_namespace("other")
    server.store.create("pods", "other", pod("x"))
    with raw_watch(core.list_namespaced_pod, "default", timeout_seconds=1) as events:
        got = [(e["type"], e["object"]["metadata"]["name"]) for e in events]
    assert got == [("ADDED", "a"), ("ADDED", "b"), ("ADDED", "c")]


def test_live_watch_with_selector_transitions(core: client.CoreV1Api, server: SimApiServer) -> None:
    store = server.store
    store.create("pods", "default", pod("p", labels={"app": "web"}))
    store.create("pods", "default", pod("q", labels={"app": "db"}))
    rv = str(store.resource_version)
    with raw_watch(
        core.list_namespaced_pod, "default", resource_version=rv, label_selector="app=web", timeout_seconds=5
    ) as events:
        store.patch("pods", "default", "p", {"metadata": {"labels": {"app": "db"}}})  # leaves
        store.patch("pods", "default", "q", {"metadata": {"labels": {"app": "web"}}})  # enters
        store.patch("pods", "default", "q", {"metadata": {"labels": {"x": "1"}}})  # still in
        store.patch("pods", "default", "p", {"metadata": {"labels": {"x": "1"}}})  # still out
        store.delete("pods", "default", "q")
        got = [(e["type"], e["object"]["metadata"]["name"]) for e in take(events, 5)]
    assert got == [("DELETED", "p"), ("ADDED", "q"), ("MODIFIED", "q"), ("MODIFIED", "q"), ("DELETED", "q")]


def test_watch_bookmarks(core: client.CoreV1Api, server: SimApiServer) -> None:
    server.store.create("pods", "default", pod("p"))
    rv = str(server.store.resource_version)
    with raw_watch(
        core.list_namespaced_pod,
        "default",
        resource_version=rv,
        allow_watch_bookmarks=True,
        timeout_seconds=1,
    ) as events:
        got = list(events)
    assert len(got) >= 2 and {e["type"] for e in got} == {"BOOKMARK"}
    assert got[0]["object"] == {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": rv}}

    w = watch.Watch()
    seen = []
    for event in w.stream(
        core.list_namespaced_pod,
        "default",
        resource_version=rv,
        allow_watch_bookmarks=True,
        timeout_seconds=5,
    ):
        seen.append(event["type"])
        if event["type"] == "BOOKMARK":
            if len(seen) == 1:
                server.store.create("pods", "default", pod("q"))
            else:
                w.stop()
    assert seen[:3] == ["BOOKMARK", "ADDED", "BOOKMARK"]
    assert w.resource_version == str(server.store.resource_version)


def test_watch_of_compacted_version_gets_410(core: client.CoreV1Api, server: SimApiServer) -> None:
    store = server.store
    rv0 = str(store.resource_version)
    store.create("pods", "default", pod("p"))
    server.compact()
    with raw_watch(core.list_namespaced_pod, "default", resource_version=rv0) as events:
        got = list(events)
    assert len(got) == 1 and got[0]["type"] == "ERROR"
    assert got[0]["object"] == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f"too old resource version: {rv0} ({store.resource_version})",
        "reason": "Expired",
        "code": 410,
    }
    with pytest.raises(ApiException) as err:  # Watch.stream retries once on 410, then raises
        list(watch.Watch().stream(core.list_namespaced_pod, "default", resource_version=rv0))
    assert err.value.status == 410


def test_history_window_expires_old_versions() -> None:
    store = Store(history_window=5)
    rv0 = str(store.resource_version)
    for i in range(5):
        store.create("nodes", None, {"metadata": {"name": f"n{i}"}})
    store.watch("nodes", resource_version=rv0).close()  # exactly at the window's edge
    store.create("nodes", None, {"metadata": {"name": "n5"}})
    with pytest.raises(SimApiError) as err:
        store.watch("nodes", resource_version=rv0)
    assert err.value.code == 410 and err.value.reason == "Expired"


def test_watch_list_initial_events_and_named_watch(core: client.CoreV1Api, server: SimApiServer) -> None:
    store = server.store
    store.create("pods", "default", pod("a"))
    store.create("pods", "default", pod("b"))
    rv = str(store.resource_version)
    with raw_watch(
        core.list_namespaced_pod,
        "default",
        send_initial_events=True,
        resource_version_match="NotOlderThan",
        allow_watch_bookmarks=True,
        timeout_seconds=5,
    ) as events:
        first = take(events, 3)
    assert [e["type"] for e in first] == ["ADDED", "ADDED", "BOOKMARK"]
    assert first[2]["object"]["metadata"] == {
        "resourceVersion": rv,
        "annotations": {"k8s.io/initial-events-end": "true"},
    }

    api = core.api_client
    with api.call_api(
        *api.param_serialize(
            "GET",
            "/api/v1/namespaces/default/pods/b",
            query_params=[("watch", "true"), ("resourceVersion", rv)],
        )
    ).response as resp:
        store.patch("pods", "default", "a", {"metadata": {"labels": {"x": "1"}}})
        store.patch("pods", "default", "b", {"metadata": {"labels": {"x": "1"}}})
        line = json.loads(next(iter_resp_lines(resp)))
        resp.release_conn()
    assert (line["type"], line["object"]["metadata"]["name"]) == ("MODIFIED", "b")


def test_watch_timeout_ends_stream_cleanly(core: client.CoreV1Api, server: SimApiServer) -> None:
    rv = str(server.store.resource_version)
    start = time.monotonic()
    with raw_watch(core.list_namespaced_pod, "default", resource_version=rv, timeout_seconds=1) as events:
        assert list(events) == []
    assert 0.9 <= time.monotonic() - start < 3
    assert core.list_namespaced_pod("default").items == []  # the connection is still usable


def test_watch_custom_objects(custom: client.CustomObjectsApi, server: SimApiServer) -> None:
    rv = str(server.store.resource_version)
    server.store.create("ipamblocks", None, block("10-0-0-0-26"))
    server.store.patch("ipamblocks", None, "10-0-0-0-26", {"spec": {"affinity": "host:n9"}})
    events = list(
        watch.Watch().stream(
            custom.list_cluster_custom_object, *CALICO, "ipamblocks", resource_version=rv, timeout_seconds=1
        )
    )
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED"]
    assert events[1]["object"]["spec"]["affinity"] == "host:n9"


def test_stop_ends_open_watches_promptly() -> None:
    srv = SimApiServer().start()
    with srv.api_client() as api:
        core = client.CoreV1Api(api)
        with raw_watch(core.list_namespaced_pod, "default", resource_version="1") as events:
            start = time.monotonic()
            srv.stop()
            assert time.monotonic() - start < 2
            with contextlib.suppress(urllib3.exceptions.ProtocolError):
                assert list(events) == []


def test_shared_informer_recovers_from_a_restart(core: client.CoreV1Api, server: SimApiServer) -> None:
    """The client's own informer lists, watches, and re-lists after watches drop and expire."""
    store = server.store
    store.create("pods", "default", pod("a"))
    informer = SharedInformer(core.list_namespaced_pod, namespace="default")

    def cached() -> set[str]:
        return {p.metadata.name for p in informer.cache.list()}

    informer.start()
    try:
        wait_until(lambda: cached() == {"a"} and server.open_watches == 1)
        store.create("pods", "default", pod("b"))
        wait_until(lambda: cached() == {"a", "b"})
        store.create("nodes", None, {"metadata": {"name": "n1"}})  # the informer has not seen this rv
        server.compact()  # a restarted API server has no history ...
        assert server.drop_watches("pods") == 1  # ... and no open watches
        store.delete("pods", "default", "a")
        store.create("pods", "default", pod("c"))
        wait_until(lambda: cached() == {"b", "c"} and server.open_watches == 1)
        assert len(server.find_requests(verb="list", resource="pods")) == 2  # it re-listed
    finally:
        _stop_informer(informer, server)


def _stop_informer(informer: SharedInformer, server: SimApiServer) -> None:
    """`SharedInformer.stop` joins a thread that only sees the stop after its watch yields or ends
    (`Watch.stop` does not interrupt a blocked read): end the informer's watches until it has stopped
    (a suite run on CI waited out pytest-timeout's 300 s in that join)."""
    stopper = threading.Thread(target=informer.stop, name="stop-informer", daemon=True)
    stopper.start()

    def stopped() -> bool:
        server.drop_watches("pods")  # also one it reopened before seeing the stop
        return not stopper.is_alive()

    wait_until(stopped)
