"""The simulated cluster serves what Calico's own kube-controllers needs to run its node controller.

From a reading of kube-controllers (release-v3.33), checked against the binary on this simulator: it
creates the `default`, `kube-admin` and `kube-baseline` Tiers at start (a 404 is fatal: "Failed to
initialize datastore"); it PUTs its KubeControllersConfiguration's status through the `status`
subresource before any controller starts; it lists and watches apiextensions.k8s.io/v1
CustomResourceDefinitions; its data feed lists host endpoints and the (staged)(global)network policies,
namespaced where Calico's are; it asks for protobuf first and takes JSON.  The scopes, kinds and
subresources served are Calico's own CRDs' (`../shared/calico-crds`, read from there, never copied)."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from kubernetes import client as k8s

from lab.apiserver.apiserver import SimApiServer
from lab.apiserver.resources import calico_resources
from lab.apiserver.store import Store
from shared.calicogroup import V1, V3, CalicoGroup

CRDS = Path(__file__).resolve().parents[4] / "shared" / "calico-crds"


@pytest.fixture
def server() -> Iterator[SimApiServer]:
    with SimApiServer(Store(seed=1)) as srv:
        yield srv


def _crd_files(group: CalicoGroup) -> dict[str, dict[str, Any]]:
    folder = CRDS / ("v3" if group.v3 else "v1")
    out = {}
    for path in sorted(folder.glob(f"{group.name}_*.yaml")):
        doc = yaml.safe_load(path.read_text())
        out[doc["spec"]["names"]["plural"]] = doc["spec"]
    return out


@pytest.mark.skipif(not CRDS.is_dir(), reason=f"Calico's CRDs are not beside the project ({CRDS})")
@pytest.mark.parametrize("group", [V1, V3], ids=str)
def test_every_calico_crd_is_served_with_its_scope_kind_and_subresources(group: CalicoGroup) -> None:
    crds = _crd_files(group)
    served = {rt.plural: rt for rt in calico_resources(group)}
    assert set(served) == set(crds)
    for plural, spec in crds.items():
        rt = served[plural]
        (version,) = spec["versions"]
        assert rt.kind == spec["names"]["kind"], plural
        assert rt.namespaced == (spec["scope"] == "Namespaced"), plural
        assert set(rt.subresources) == set(version.get("subresources") or {}), plural
        assert rt.version == version["name"], plural


def test_tiers_are_created_and_the_kcc_status_is_written_through_its_subresource(
    server: SimApiServer,
) -> None:
    api = k8s.CustomObjectsApi(server.api_client())
    group, version = V1.name, V1.version
    for name in ("default", "kube-admin", "kube-baseline"):
        body = {
            "apiVersion": V1.api_version,
            "kind": "Tier",
            "metadata": {"name": name},
            "spec": {"order": 100},
        }
        api.create_cluster_custom_object(group, version, "tiers", body)
    assert {
        t["metadata"]["name"] for t in api.list_cluster_custom_object(group, version, "tiers")["items"]
    } == {
        "default",
        "kube-admin",
        "kube-baseline",
    }
    kcc = {
        "apiVersion": V1.api_version,
        "kind": "KubeControllersConfiguration",
        "metadata": {"name": "default"},
        "spec": {"controllers": {"node": {"leakGracePeriod": "15m"}}},
    }
    created = api.create_cluster_custom_object(group, version, "kubecontrollersconfigurations", kcc)
    created["status"] = {"runningConfig": {"controllers": {"node": {"leakGracePeriod": "15m"}}}}
    created["spec"] = {"changed": "by a status write, which must not take it"}
    api.replace_cluster_custom_object_status(
        group, version, "kubecontrollersconfigurations", "default", created
    )
    got = api.get_cluster_custom_object(group, version, "kubecontrollersconfigurations", "default")
    assert got["status"]["runningConfig"]["controllers"]["node"]["leakGracePeriod"] == "15m"
    assert got["spec"] == kcc["spec"]


def test_network_policies_are_namespaced_and_host_endpoints_are_not(server: SimApiServer) -> None:
    api = k8s.CustomObjectsApi(server.api_client())
    group, version = V1.name, V1.version
    policy = {"apiVersion": V1.api_version, "kind": "NetworkPolicy", "metadata": {"name": "p"}, "spec": {}}
    server.store.ensure_namespace("ns-1")
    api.create_namespaced_custom_object(group, version, "ns-1", "networkpolicies", policy)
    assert [
        p["metadata"]["namespace"]
        for p in api.list_cluster_custom_object(group, version, "networkpolicies")["items"]
    ] == ["ns-1"]
    hep = {"apiVersion": V1.api_version, "kind": "HostEndpoint", "metadata": {"name": "h"}, "spec": {}}
    api.create_cluster_custom_object(group, version, "hostendpoints", hep)
    for plural in ("globalnetworkpolicies", "stagedglobalnetworkpolicies", "stagednetworkpolicies"):
        assert api.list_cluster_custom_object(group, version, plural)["items"] == []


def test_custom_resource_definitions_are_listed_for_every_served_custom_resource(
    server: SimApiServer,
) -> None:
    crds = k8s.ApiextensionsV1Api(server.api_client()).list_custom_resource_definition()
    by_name = {c.metadata.name: c for c in crds.items}
    assert by_name["ipamblocks.crd.projectcalico.org"].spec.scope == "Cluster"
    assert by_name["networkpolicies.crd.projectcalico.org"].spec.scope == "Namespaced"
    (kcc_version,) = by_name["kubecontrollersconfigurations.crd.projectcalico.org"].spec.versions
    assert kcc_version.subresources.status is not None
    assert len(by_name) == len(calico_resources(V1))


def test_a_client_that_asks_for_protobuf_first_gets_json(server: SimApiServer) -> None:
    req = urllib.request.Request(
        f"{server.url}/api/v1/nodes",
        headers={"Accept": "application/vnd.kubernetes.protobuf, application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.headers["Content-Type"].startswith("application/json")
        assert orjson.loads(resp.read())["kind"] == "NodeList"


def test_a_built_in_lists_items_carry_no_type_meta_as_on_a_real_server(server: SimApiServer) -> None:
    """A real kube-apiserver leaves kind/apiVersion out of a built-in kind's list items, not a custom
    resource's (docs/real-apiserver.md); a single GET keeps them."""
    store = server.store
    store.create("nodes", None, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
    store.create(
        "ipamblocks",
        None,
        {"apiVersion": V1.api_version, "kind": "IPAMBlock", "metadata": {"name": "b"}, "spec": {}},
    )

    def get(path: str) -> Any:
        with urllib.request.urlopen(f"{server.url}{path}", timeout=10) as resp:
            return orjson.loads(resp.read())

    (node,) = get("/api/v1/nodes")["items"]
    assert "kind" not in node and "apiVersion" not in node and node["metadata"]["name"] == "n1"
    assert get("/api/v1/nodes/n1")["kind"] == "Node"
    (block,) = get(f"/apis/{V1.api_version}/ipamblocks")["items"]
    assert block["kind"] == "IPAMBlock" and block["apiVersion"] == V1.api_version
