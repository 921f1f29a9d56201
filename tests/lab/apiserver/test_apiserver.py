"""The simulated API server, driven by the official kubernetes client over real HTTP."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import urllib3
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException
from kubernetes.informer.informer import SharedInformer
from kubernetes.watch.watch import iter_resp_lines

from lab.apiserver.apiserver import SimApiServer
from lab.apiserver.faults import FaultInjector, FaultRule
from lab.apiserver.store import SimApiError, Store
from tests.polling import wait_until

CALICO = ("crd.projectcalico.org", "v1")


def pod(name: str, node: str | None = None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "app", "image": "busybox"}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": spec}


def block(name: str, affinity: str = "host:n1") -> dict[str, Any]:
    return {
        "apiVersion": "crd.projectcalico.org/v1",
        "kind": "IPAMBlock",
        "metadata": {"name": name},
        "spec": {"cidr": "10.0.0.0/26", "affinity": affinity, "allocations": [0, None]},
    }


def status_of(exc: ApiException) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(exc.body)
    assert body["kind"] == "Status"
    assert body["code"] == exc.status
    return body


@contextlib.contextmanager
def raw_watch(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Iterator[Iterator[dict[str, Any]]]:
    """A watch as parsed JSON lines, read with ``_preload_content=False``."""
    resp = func(*args, watch=True, _preload_content=False, **kwargs)
    try:
        yield (json.loads(line) for line in iter_resp_lines(resp) if line)
    finally:
        resp.close()
        resp.release_conn()


def take(events: Iterator[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """The next ``n`` events of a live watch (blocks until they arrive or the watch ends)."""
    return [next(events) for _ in range(n)]


def http(server: SimApiServer, method: str, path: str, body: Any = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(server.url + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=5) as resp:
        raw = resp.read()
    return raw.decode() if raw == b"ok" else json.loads(raw)


# -- discovery --------------------------------------------------------------------------------------


def test_discovery(api: client.ApiClient, server: SimApiServer) -> None:
    assert client.CoreApi(api).get_api_versions().versions == ["v1"]
    groups = {g.name: g for g in client.ApisApi(api).get_api_versions().groups}
    assert set(groups) == {"coordination.k8s.io", "apiextensions.k8s.io", "crd.projectcalico.org"}
    assert groups["crd.projectcalico.org"].preferred_version.group_version == "crd.projectcalico.org/v1"

    core = {r.name: r for r in client.CoreV1Api(api).get_api_resources().resources}
    assert core["pods"].namespaced and core["pods"].kind == "Pod" and "watch" in core["pods"].verbs
    assert not core["nodes"].namespaced
    assert "pods/status" in core and "nodes/status" in core
    leases = {r.name for r in client.CoordinationV1Api(api).get_api_resources().resources}
    assert leases == {"leases"}
    calico = client.CustomObjectsApi(api).get_api_resources(*CALICO)
    kinds = {r.name: r.kind for r in calico.resources}
    assert kinds["ipamblocks"] == "IPAMBlock" and kinds["blockaffinities"] == "BlockAffinity"
    assert kinds["ipreservations"] == "IPReservation" and kinds["tiers"] == "Tier"
    # every Calico CRD (22 in 3.33), and the status subresources Calico's CRDs have
    assert len([n for n in kinds if "/" not in n]) == 22
    assert {n for n in kinds if "/" in n} == {
        "kubecontrollersconfigurations/status",
        "ippools/status",
        "tiers/status",
        "caliconodestatuses/status",
    }

    assert client.VersionApi(api).get_code().git_version.startswith("v1.")
    assert http(server, "GET", "/healthz") == "ok"
    assert http(server, "GET", "/readyz") == "ok"
    # a group nobody serves: the real server's mux answers in plain text (docs/real-apiserver.md)
    resp = api.call_api(*api.param_serialize("GET", "/apis/example.com/v1/widgets"))
    resp.read()
    assert resp.status == 404 and resp.data == b"404 page not found\n"
    # a served group/version, an unknown resource: a JSON Status
    resp = api.call_api(*api.param_serialize("GET", "/apis/crd.projectcalico.org/v1/widgets"))
    resp.read()
    assert resp.status == 404
    assert json.loads(resp.data)["message"] == "the server could not find the requested resource"


# -- CRUD -------------------------------------------------------------------------------------------


def test_pod_lifecycle(core: client.CoreV1Api, server: SimApiServer) -> None:
    created = core.create_namespaced_pod("default", pod("p1", "n1", {"app": "web"}))
    meta = created.metadata
    assert (created.api_version, created.kind) == ("v1", "Pod")
    assert meta.namespace == "default" and meta.generation == 1 and meta.uid
    assert int(meta.resource_version) == server.store.resource_version
    assert meta.creation_timestamp.tzinfo is not None

    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod("default", pod("p1"))
    assert err.value.status == 409 and status_of(err.value)["reason"] == "AlreadyExists"
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod("default", {"metadata": {}})
    assert err.value.status == 422 and status_of(err.value)["reason"] == "Invalid"
    generated = core.create_namespaced_pod("default", {"metadata": {"generateName": "web-"}})
    assert generated.metadata.name.startswith("web-") and len(generated.metadata.name) == 9

    got = core.read_namespaced_pod("p1", "default")
    assert got.metadata.resource_version == meta.resource_version
    listed = core.list_namespaced_pod("default")
    assert sorted(p.metadata.name for p in listed.items) == sorted(["p1", generated.metadata.name])
    assert listed.metadata.resource_version == str(server.store.resource_version)

    got.metadata.labels["tier"] = "fe"
    replaced = core.replace_namespaced_pod("p1", "default", got)
    assert int(replaced.metadata.resource_version) > int(meta.resource_version)
    assert replaced.metadata.uid == meta.uid
    assert replaced.metadata.creation_timestamp == meta.creation_timestamp
    stale = got  # still carries the old resourceVersion
    with pytest.raises(ApiException) as err:
        core.replace_namespaced_pod("p1", "default", stale)
    assert err.value.status == 409 and err.value.reason == "Conflict"
    assert "the object has been modified" in status_of(err.value)["message"]

    # strategic merge patch merges containers by name; JSON patch applies operations
    patched = core.patch_namespaced_pod(
        "p1", "default", {"spec": {"containers": [{"name": "sidecar", "image": "envoy"}]}}
    )
    assert [c.name for c in patched.spec.containers] == ["app", "sidecar"]
    patched = core.patch_namespaced_pod(
        "p1", "default", [{"op": "replace", "path": "/metadata/labels/app", "value": "api"}]
    )
    assert patched.metadata.labels == {"app": "api", "tier": "fe"}
    with pytest.raises(ApiException) as err:
        core.patch_namespaced_pod(
            "p1", "default", [{"op": "test", "path": "/metadata/labels/app", "value": "web"}]
        )
    assert err.value.status == 422
    with pytest.raises(ApiException) as err:
        core.patch_namespaced_pod("p1", "default", {"metadata": {"resourceVersion": "1"}})
    assert err.value.status == 409

    # the status subresource changes status only
    current = core.read_namespaced_pod("p1", "default")
    current.status = client.V1PodStatus(phase="Running", pod_ip="10.0.0.5")
    current.metadata.labels["ignored"] = "yes"
    after = core.replace_namespaced_pod_status("p1", "default", current)
    assert after.status.phase == "Running" and after.status.pod_ip == "10.0.0.5"
    assert "ignored" not in after.metadata.labels
    after = core.patch_namespaced_pod_status("p1", "default", {"status": {"phase": "Succeeded"}})
    assert after.status.phase == "Succeeded" and after.status.pod_ip == "10.0.0.5"

    deleted = core.delete_namespaced_pod("p1", "default")
    assert isinstance(deleted, client.V1Pod)
    assert int(deleted.metadata.resource_version) == server.store.resource_version
    for call in (
        lambda: core.read_namespaced_pod("p1", "default"),
        lambda: core.delete_namespaced_pod("p1", "default"),
        lambda: core.replace_namespaced_pod("p1", "default", current),
        lambda: core.patch_namespaced_pod("p1", "default", {"metadata": {"labels": {}}}),
    ):
        with pytest.raises(ApiException) as err:
            call()
        assert err.value.status == 404
        assert status_of(err.value)["details"] == {"name": "p1", "kind": "pods"}


def test_node_lifecycle_and_delete_preconditions(core: client.CoreV1Api) -> None:
    node = core.create_node({"metadata": {"name": "n1", "labels": {"zone": "a"}}})
    assert node.metadata.namespace is None
    patched = core.patch_node("n1", {"metadata": {"labels": {"zone": None, "pool": "x"}}})
    assert patched.metadata.labels == {"pool": "x"}
    assert [n.metadata.name for n in core.list_node().items] == ["n1"]
    core.patch_node_status("n1", {"status": {"addresses": [{"type": "InternalIP", "address": "1.2.3.4"}]}})
    assert core.read_node("n1").status.addresses[0].address == "1.2.3.4"

    stale = client.V1DeleteOptions(preconditions=client.V1Preconditions(resource_version="1"))
    with pytest.raises(ApiException) as err:
        core.delete_node("n1", body=stale)
    assert err.value.status == 409
    assert "Precondition failed: ResourceVersion in precondition: 1" in status_of(err.value)["message"]
    wrong_uid = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid="not-the-uid"))
    with pytest.raises(ApiException) as err:
        core.delete_node("n1", body=wrong_uid)
    assert f"UID in object meta: {node.metadata.uid}" in status_of(err.value)["message"]

    current = core.read_node("n1")
    ok = client.V1DeleteOptions(
        preconditions=client.V1Preconditions(
            uid=current.metadata.uid, resource_version=current.metadata.resource_version
        )
    )
    status = core.delete_node("n1", body=ok)  # nodes answer with a Status, not the object
    assert status["kind"] == "Status" and status["status"] == "Success"
    assert status["details"] == {"name": "n1", "kind": "nodes", "uid": current.metadata.uid}
    assert core.list_node().items == []


def test_ipamblock_custom_objects(custom: client.CustomObjectsApi, server: SimApiServer) -> None:
    created = custom.create_cluster_custom_object(*CALICO, "ipamblocks", block("10-0-0-0-26"))
    assert created["kind"] == "IPAMBlock" and created["metadata"]["generation"] == 1
    rv = created["metadata"]["resourceVersion"]
    got = custom.get_cluster_custom_object(*CALICO, "ipamblocks", "10-0-0-0-26")
    assert got == created
    listed = custom.list_cluster_custom_object(*CALICO, "ipamblocks")
    assert listed["kind"] == "IPAMBlockList" and [i["metadata"]["name"] for i in listed["items"]] == [
        "10-0-0-0-26"
    ]

    got["spec"]["allocations"] = [None, None]
    updated = custom.replace_cluster_custom_object(*CALICO, "ipamblocks", "10-0-0-0-26", got)
    assert updated["metadata"]["generation"] == 2 and updated["metadata"]["resourceVersion"] != rv
    with pytest.raises(ApiException) as err:
        custom.replace_cluster_custom_object(*CALICO, "ipamblocks", "10-0-0-0-26", got)  # stale rv
    assert err.value.status == 409 and err.value.reason == "Conflict"
    body = status_of(err.value)
    assert body["reason"] == "Conflict"
    assert body["details"] == {"name": "10-0-0-0-26", "group": "crd.projectcalico.org", "kind": "ipamblocks"}
    assert 'ipamblocks.crd.projectcalico.org "10-0-0-0-26"' in body["message"]

    # a custom resource refuses an update without resourceVersion, as a real API server does
    rv = got["metadata"].pop("resourceVersion")
    got["spec"]["affinity"] = "host:n2"
    with pytest.raises(ApiException) as invalid:
        custom.replace_cluster_custom_object(*CALICO, "ipamblocks", "10-0-0-0-26", got)
    assert invalid.value.status == 422
    got["metadata"]["resourceVersion"] = custom.get_cluster_custom_object(
        *CALICO, "ipamblocks", "10-0-0-0-26"
    )["metadata"]["resourceVersion"]
    assert rv
    forced = custom.replace_cluster_custom_object(*CALICO, "ipamblocks", "10-0-0-0-26", got)
    assert forced["spec"]["affinity"] == "host:n2"
    # a no-op write keeps the version
    same = custom.replace_cluster_custom_object(*CALICO, "ipamblocks", "10-0-0-0-26", forced)
    assert same["metadata"]["resourceVersion"] == forced["metadata"]["resourceVersion"]

    merged = custom.patch_cluster_custom_object(
        *CALICO, "ipamblocks", "10-0-0-0-26", {"spec": {"affinity": None, "deleted": True}}
    )
    assert "affinity" not in merged["spec"] and merged["spec"]["deleted"] is True
    with pytest.raises(ApiException) as err:
        custom.patch_cluster_custom_object(
            *CALICO,
            "ipamblocks",
            "10-0-0-0-26",
            {"spec": {}},
            _content_type="application/strategic-merge-patch+json",
        )
    assert err.value.status == 415

    mismatch = client.V1DeleteOptions(preconditions=client.V1Preconditions(resource_version=rv))
    with pytest.raises(ApiException) as err:
        custom.delete_cluster_custom_object(*CALICO, "ipamblocks", "10-0-0-0-26", body=mismatch)
    assert err.value.status == 409 and status_of(err.value)["reason"] == "Conflict"
    current_rv = merged["metadata"]["resourceVersion"]
    match = client.V1DeleteOptions(preconditions=client.V1Preconditions(resource_version=current_rv))
    gone = custom.delete_cluster_custom_object(*CALICO, "ipamblocks", "10-0-0-0-26", body=match)
    assert gone["metadata"]["name"] == "10-0-0-0-26"
    assert int(gone["metadata"]["resourceVersion"]) == server.store.resource_version
    with pytest.raises(ApiException) as err:
        custom.get_cluster_custom_object(*CALICO, "ipamblocks", "10-0-0-0-26")
    assert err.value.status == 404


def test_leases(coord: client.CoordinationV1Api, server: SimApiServer) -> None:
    now = dt.datetime.now(dt.UTC)
    lease = client.V1Lease(
        metadata=client.V1ObjectMeta(name="ipamgc-leader"),
        spec=client.V1LeaseSpec(holder_identity="a", lease_duration_seconds=15, renew_time=now),
    )
    created = coord.create_namespaced_lease("kube-system", lease)
    assert created.spec.holder_identity == "a" and created.spec.renew_time is not None
    fresh = coord.read_namespaced_lease("ipamgc-leader", "kube-system")
    fresh.spec.holder_identity = "b"
    taken = coord.replace_namespaced_lease("ipamgc-leader", "kube-system", fresh)
    assert taken.spec.holder_identity == "b"
    created.spec.holder_identity = "c"  # based on an old read: must lose
    with pytest.raises(ApiException) as err:
        coord.replace_namespaced_lease("ipamgc-leader", "kube-system", created)
    assert err.value.status == 409 and err.value.reason == "Conflict"
    assert coord.read_namespaced_lease("ipamgc-leader", "kube-system").spec.holder_identity == "b"
    assert [x.metadata.name for x in coord.list_namespaced_lease("kube-system").items] == ["ipamgc-leader"]

    # a lease may not be overwritten blindly: without a resourceVersion the update is refused
    # (the real registry's AllowUnconditionalUpdate() is false for leases)
    blind = client.V1Lease(metadata=client.V1ObjectMeta(name="ipamgc-leader"), spec=client.V1LeaseSpec())
    with pytest.raises(ApiException) as err:
        coord.replace_namespaced_lease("ipamgc-leader", "kube-system", blind)
    assert err.value.status == 422
    assert status_of(err.value)["message"] == (
        'leases.coordination.k8s.io "ipamgc-leader" is invalid: '
        "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update"
    )
    assert status_of(err.value)["details"]["causes"][0]["field"] == "metadata.resourceVersion"
    assert coord.read_namespaced_lease("ipamgc-leader", "kube-system").spec.holder_identity == "b"

    # the request log says which resourceVersion each write was conditional on
    puts = server.find_requests(method="PUT", resource="leases")
    assert [(p.status, p.precondition) for p in puts] == [
        (200, fresh.metadata.resource_version),
        (409, created.metadata.resource_version),
        (422, None),
    ]


def test_dry_run_finalizers_and_create_on_update(
    core: client.CoreV1Api, coord: client.CoordinationV1Api, server: SimApiServer
) -> None:
    rv = server.store.resource_version
    dry = core.create_namespaced_pod("default", pod("dry"), dry_run="All")
    assert dry.metadata.name == "dry" and server.store.resource_version == rv
    assert core.list_namespaced_pod("default").items == []

    core.create_namespaced_pod("default", {"metadata": {"name": "f", "finalizers": ["example.com/x"]}})
    terminating, code, _ = core.delete_namespaced_pod_with_http_info("f", "default")
    assert code == 200 and terminating.metadata.deletion_timestamp is not None  # 200, as the real server
    assert core.read_namespaced_pod("f", "default").metadata.deletion_timestamp is not None
    core.patch_namespaced_pod("f", "default", {"metadata": {"finalizers": None}})
    with pytest.raises(ApiException) as err:
        core.read_namespaced_pod("f", "default")
    assert err.value.status == 404

    # leases (unlike pods or Calico resources) may be created by PUT
    body = client.V1Lease(
        metadata=client.V1ObjectMeta(name="l"), spec=client.V1LeaseSpec(holder_identity="a")
    )
    created, code, _ = coord.replace_namespaced_lease_with_http_info("l", "kube-system", body)
    assert code == 201 and created.metadata.uid
    with pytest.raises(ApiException) as err:
        core.replace_namespaced_pod("nope", "default", {"metadata": {"name": "nope"}})
    assert err.value.status == 404


# -- lists ------------------------------------------------------------------------------------------


def test_pagination_is_a_consistent_snapshot(core: client.CoreV1Api, server: SimApiServer) -> None:
    store = server.store
    for i in range(250):
        store.create("pods", "default", pod(f"p{i:03d}"))
    store.ensure_namespace("other")
    store.create("pods", "other", pod("elsewhere"))
    first = core.list_namespaced_pod("default", limit=100)
    snapshot = first.metadata.resource_version
    assert len(first.items) == 100 and first.metadata._continue
    assert first.metadata.remaining_item_count == 150

    # writes between pages must not show up in the continued list
    store.delete("pods", "default", "p200")
    store.create("pods", "default", pod("p999"))
    store.patch("pods", "default", "p150", {"metadata": {"labels": {"changed": "yes"}}})

    pages, token = [first], first.metadata._continue
    while token:
        page = core.list_namespaced_pod("default", limit=100, _continue=token)
        assert page.metadata.resource_version == snapshot
        pages.append(page)
        token = page.metadata._continue
    names = [p.metadata.name for page in pages for p in page.items]
    assert [len(page.items) for page in pages] == [100, 100, 50]
    assert names == [f"p{i:03d}" for i in range(250)]
    assert all(int(p.metadata.resource_version) <= int(snapshot) for page in pages for p in page.items)
    p150 = next(p for p in pages[1].items if p.metadata.name == "p150")
    assert not p150.metadata.labels

    # a fresh list sees the writes; all-namespaces lists are ordered by (namespace, name)
    fresh = [p.metadata.name for p in core.list_namespaced_pod("default").items]
    assert "p200" not in fresh and "p999" in fresh
    everywhere = core.list_pod_for_all_namespaces(limit=250)
    keys = [(p.metadata.namespace, p.metadata.name) for p in everywhere.items]
    assert keys == sorted(keys) and everywhere.metadata._continue
    rest = core.list_pod_for_all_namespaces(limit=250, _continue=everywhere.metadata._continue)
    assert [p.metadata.name for p in rest.items] == ["elsewhere"] and not rest.metadata._continue


def test_expired_continue_is_410(core: client.CoreV1Api, server: SimApiServer) -> None:
    for i in range(5):
        server.store.create("pods", "default", pod(f"p{i}"))
    first = core.list_namespaced_pod("default", limit=2)
    server.store.create("pods", "default", pod("later"))
    server.compact()
    with pytest.raises(ApiException) as err:
        core.list_namespaced_pod("default", limit=2, _continue=first.metadata._continue)
    assert err.value.status == 410
    body = status_of(err.value)
    assert body["reason"] == "Expired" and "too old to display a consistent list" in body["message"]
    assert body["metadata"]["continue"]  # the inconsistent-continue token a real server offers
    with pytest.raises(ApiException) as err:
        core.list_namespaced_pod("default", limit=2, _continue="garbage")
    assert err.value.status == 400


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("app=web", {"a", "c"}),
        ("app==web", {"a", "c"}),
        ("app!=web", {"b", "d"}),
        ("app in (web,db)", {"a", "b", "c"}),
        ("app notin (web)", {"b", "d"}),
        ("tier", {"a", "b"}),
        ("!tier", {"c", "d"}),
        ("app=web,tier", {"a"}),
        ("app=web,!tier", {"c"}),
        ("", {"a", "b", "c", "d"}),
    ],
)
def test_label_selectors(
    core: client.CoreV1Api, server: SimApiServer, selector: str, expected: set[str]
) -> None:
    store = server.store
    store.create("pods", "default", pod("a", labels={"app": "web", "tier": "fe"}))
    store.create("pods", "default", pod("b", labels={"app": "db", "tier": "be"}))
    store.create("pods", "default", pod("c", labels={"app": "web"}))
    store.create("pods", "default", pod("d"))
    items = core.list_namespaced_pod("default", label_selector=selector).items
    assert {p.metadata.name for p in items} == expected


def test_field_selectors_and_bad_selectors(
    core: client.CoreV1Api, custom: client.CustomObjectsApi, server: SimApiServer
) -> None:
    store = server.store
    store.create("pods", "default", pod("a", "n1"))
    store.create("pods", "default", pod("b", "n2"))
    store.create("pods", "default", pod("pending"))
    store.create("pods", "kube-system", pod("c", "n1"))

    def names(**kw: Any) -> set[str]:
        return {p.metadata.name for p in core.list_pod_for_all_namespaces(**kw).items}

    assert names(field_selector="spec.nodeName=n1") == {"a", "c"}
    assert names(field_selector="spec.nodeName==n1,metadata.namespace=default") == {"a"}
    assert names(field_selector="spec.nodeName!=n1") == {"b", "pending"}
    assert names(field_selector="spec.nodeName=") == {"pending"}
    assert names(field_selector="metadata.name=b") == {"b"}
    store.create("ipamblocks", None, block("10-0-0-0-26"))
    store.create("ipamblocks", None, block("10-0-0-64-26"))
    only = custom.list_cluster_custom_object(
        *CALICO, "ipamblocks", field_selector="metadata.name=10-0-0-64-26"
    )
    assert [b["metadata"]["name"] for b in only["items"]] == ["10-0-0-64-26"]

    for kw in (
        {"field_selector": "spec.foo=bar"},
        {"field_selector": "spec.nodeName"},
        {"label_selector": "app in web"},
        {"label_selector": "a b"},
    ):
        with pytest.raises(ApiException) as err:
            core.list_pod_for_all_namespaces(**kw)
        assert err.value.status == 400 and status_of(err.value)["reason"] == "BadRequest"
    with pytest.raises(ApiException) as err:
        custom.list_cluster_custom_object(*CALICO, "ipamblocks", field_selector="spec.nodeName=x")
    assert "field label not supported: spec.nodeName" in status_of(err.value)["message"]


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


# -- request log, kubeconfig, in-process store --------------------------------------------------------


def test_request_log(server: SimApiServer, api: client.ApiClient) -> None:
    server.store.create("ipamblocks", None, block("10-0-0-0-26"))
    api.user_agent = "leader-a"
    leader = client.CustomObjectsApi(api)
    obj = leader.get_cluster_custom_object(*CALICO, "ipamblocks", "10-0-0-0-26")
    obj["spec"]["allocations"] = [None, None]
    leader.replace_cluster_custom_object(*CALICO, "ipamblocks", "10-0-0-0-26", obj)
    with server.api_client() as other:
        other.user_agent = "stale-leader"
        stale = client.CustomObjectsApi(other)
        stale.list_cluster_custom_object(*CALICO, "ipamblocks", label_selector="a=b")
        with pytest.raises(ApiException):
            stale.replace_cluster_custom_object(*CALICO, "ipamblocks", "10-0-0-0-26", obj)

    puts = server.find_requests(method="PUT", resource="ipamblocks")
    assert [(r.user_agent, r.status) for r in puts] == [("leader-a", 200), ("stale-leader", 409)]
    assert not server.find_requests(method="PUT", user_agent="stale-leader", status=200)
    listing = server.find_requests(verb="list", user_agent="stale-leader")[0]
    assert listing.query == {"labelSelector": "a=b"} and listing.name is None
    assert listing.path == "/apis/crd.projectcalico.org/v1/ipamblocks"
    get = server.find_requests(verb="get")[0]
    assert (get.resource, get.name, get.namespace, get.method) == ("ipamblocks", "10-0-0-0-26", None, "GET")
    assert len(server.requests) == 4
    server.clear_requests()
    assert server.requests == []


def test_kubeconfig_and_client_configuration(server: SimApiServer, tmp_path: Path) -> None:
    path = server.write_kubeconfig(tmp_path / "kubeconfig")
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(path), client_configuration=cfg)
    assert cfg.host == server.url == server.client_configuration().host
    server.store.create("nodes", None, {"metadata": {"name": "n1"}})
    with client.ApiClient(cfg) as api:
        assert [n.metadata.name for n in client.CoreV1Api(api).list_node().items] == ["n1"]


def test_store_in_process_semantics() -> None:
    store = Store(seed=1)
    commits: list[tuple[str, str]] = []
    store.add_hook(lambda plural, etype, old, new: commits.append((plural, etype)))
    node = store.create("nodes", None, {"metadata": {"name": "n1"}})
    node["metadata"]["labels"] = {"mutated": "locally"}  # returned objects are copies
    assert "labels" not in store.get("nodes", None, "n1")["metadata"]
    with pytest.raises(SimApiError) as err:
        store.replace("nodes", None, "n1", {"metadata": {"name": "n1", "resourceVersion": "1"}})
    assert (err.value.code, err.value.reason) == (409, "Conflict")
    with pytest.raises(SimApiError) as err:
        store.create("nodes", None, {"metadata": {"name": "n2", "resourceVersion": "5"}})
    assert err.value.code == 500

    # finalizers: delete marks the object terminating; removing the last finalizer deletes it
    store.create("pods", "default", {"metadata": {"name": "f", "finalizers": ["x/y"]}})
    terminating = store.delete("pods", "default", "f")
    assert terminating["metadata"]["deletionTimestamp"]
    assert store.get("pods", "default", "f")["metadata"]["deletionTimestamp"]
    store.patch("pods", "default", "f", {"metadata": {"finalizers": None}})
    with pytest.raises(SimApiError):
        store.get("pods", "default", "f")
    assert commits == [
        ("nodes", "ADDED"),
        ("pods", "ADDED"),
        ("pods", "MODIFIED"),
        ("pods", "DELETED"),
    ]

    # an in-process watcher sees the same events the HTTP layer streams
    with store.watch("pods", "default", resource_version=str(store.resource_version)) as watcher:
        done = threading.Event()

        def writer() -> None:
            store.create("pods", "default", {"metadata": {"name": "w"}})
            done.set()

        threading.Thread(target=writer).start()
        events = wait_until(lambda: watcher.poll(0.1))
        assert [(t, e.obj["metadata"]["name"]) for t, e in events] == [("ADDED", "w")]
        assert done.wait(5)
