"""The simulated API server over real HTTP, CRUD: pods, nodes and their delete preconditions, IPAMBlocks as
custom objects, leases, dry runs, finalizers and create-on-update."""

from __future__ import annotations

import datetime as dt

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from lab.apiserver.apiserver import SimApiServer
from tests.lab.apiserver.apiserver_helpers import CALICO, block, pod, status_of

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
