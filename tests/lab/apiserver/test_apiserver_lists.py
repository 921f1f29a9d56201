"""The simulated API server over real HTTP, lists: consistent pagination, expired continue tokens (410), label
and field selectors."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from lab.apiserver.apiserver import SimApiServer
from tests.lab.apiserver.apiserver_helpers import CALICO, block, pod, status_of

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
