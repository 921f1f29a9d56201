"""The simulated API server, driven by the official kubernetes client over real HTTP: discovery, the request
log, the kubeconfig it writes, and the store's semantics in process (CRUD, lists, watches and faults: the
`test_apiserver_*.py` modules next to this one)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from lab.apiserver.apiserver import SimApiServer
from lab.apiserver.store import SimApiError, Store
from tests.lab.apiserver.apiserver_helpers import CALICO, block, http
from tests.polling import wait_until

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
