"""The simulated API server answers as kube-apiserver 1.37.2 did in the realapi tier (docs/real-apiserver.md):
admission (a namespace must exist and not be terminating; a pod needs its service account), a new pod
made Pending, a bound pod's DELETE graceful, a pod's delete in two events, finalizers answered with 200.

Each expectation here was measured on the real server with the same request; the realapi tier's
`test_sim_parity.py` sends the same requests to both and compares the answers.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from lab.apiserver.apiserver import SimApiServer
from lab.apiserver.store import Store


def pod_body(name: str, node: str | None = "n1", **spec: Any) -> dict[str, Any]:
    """A pod sent Running with an IP (what a real server makes Pending); also the parity test's."""
    body: dict[str, Any] = {"containers": [{"name": "c", "image": "x"}], **spec}
    if node:
        body["nodeName"] = node
    status = {"phase": "Running", "podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.1"}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": body, "status": status}


def _status(exc: ApiException) -> dict[str, Any]:
    import json

    return dict(json.loads(exc.body))


def test_a_new_cluster_has_the_system_namespaces_each_with_its_default_service_account(
    core: client.CoreV1Api,
) -> None:
    names = sorted(ns.metadata.name for ns in core.list_namespace().items)
    assert names == ["default", "kube-node-lease", "kube-public", "kube-system"]
    for name in names:
        assert [sa.metadata.name for sa in core.list_namespaced_service_account(name).items] == ["default"]


def test_a_namespaced_object_needs_its_namespace(
    core: client.CoreV1Api, custom: client.CustomObjectsApi
) -> None:
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod("nons", pod_body("p1"))
    assert exc.value.status == 404
    body = _status(exc.value)
    assert body["message"] == 'namespaces "nons" not found'
    assert body["details"] == {"name": "nons", "kind": "namespaces"}
    policy = {"apiVersion": "crd.projectcalico.org/v1", "kind": "NetworkPolicy", "metadata": {"name": "x"}}
    with pytest.raises(ApiException) as exc:
        custom.create_namespaced_custom_object(
            "crd.projectcalico.org", "v1", "nons", "networkpolicies", policy
        )
    assert exc.value.status == 404
    lease = client.V1Lease(metadata=client.V1ObjectMeta(name="l"), spec=client.V1LeaseSpec())
    with pytest.raises(ApiException) as exc:  # a PUT that would create it: the same admission
        client.CoordinationV1Api(core.api_client).replace_namespaced_lease("l", "nolease", lease)
    assert exc.value.status == 404


def test_a_new_namespace_is_active_with_its_label_finalizer_and_service_account(
    core: client.CoreV1Api,
) -> None:
    ns = core.create_namespace({"metadata": {"name": "ns1"}})
    assert ns.metadata.labels == {"kubernetes.io/metadata.name": "ns1"}
    assert ns.spec.finalizers == ["kubernetes"] and ns.status.phase == "Active"
    assert [sa.metadata.name for sa in core.list_namespaced_service_account("ns1").items] == ["default"]


def test_a_pod_needs_its_service_account(core: client.CoreV1Api) -> None:
    core.create_namespace({"metadata": {"name": "ns1"}})
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod("ns1", pod_body("p1", serviceAccountName="other"))
    assert exc.value.status == 403
    assert _status(exc.value)["message"] == (
        'pods "p1" is forbidden: error looking up service account ns1/other: serviceaccount "other" not found'
    )
    core.delete_namespaced_service_account("default", "ns1")
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod("ns1", pod_body("p1"))
    assert exc.value.status == 403 and "ns1/default" in _status(exc.value)["message"]


def test_a_new_pods_status_is_pending_whatever_it_was_sent_with(core: client.CoreV1Api) -> None:
    created = core.create_namespaced_pod("default", pod_body("p1"))
    assert created.status.phase == "Pending" and created.status.qos_class == "BestEffort"
    assert created.status.pod_ip is None and created.status.pod_ips is None
    burstable = pod_body("p2")
    burstable["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1"}}
    assert core.create_namespaced_pod("default", burstable).status.qos_class == "Burstable"
    guaranteed = pod_body("p3")
    guaranteed["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1", "memory": "1Gi"}}
    assert core.create_namespaced_pod("default", guaranteed).status.qos_class == "Guaranteed"
    # the kubelet reports the IPs through /status afterwards
    pod = core.read_namespaced_pod("p1", "default")
    pod.status = client.V1PodStatus(
        phase="Running", pod_ip="10.0.0.1", pod_ips=[client.V1PodIP(ip="10.0.0.1")]
    )
    assert core.replace_namespaced_pod_status("p1", "default", pod).status.pod_ip == "10.0.0.1"


def test_a_bound_pods_delete_is_graceful_until_the_kubelet_confirms(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod_body("p1"))
    first, code, _ = core.delete_namespaced_pod_with_http_info("p1", "default")
    assert code == 200
    kept = core.read_namespaced_pod("p1", "default")  # still there, terminating
    assert kept.metadata.deletion_grace_period_seconds == 30 and kept.metadata.generation == 2
    marked = kept.metadata.deletion_timestamp - kept.metadata.creation_timestamp
    assert 29 <= marked.total_seconds() <= 31
    again = core.delete_namespaced_pod("p1", "default")  # no shorter grace: nothing changes
    assert again.metadata.resource_version == kept.metadata.resource_version
    shorter = core.delete_namespaced_pod("p1", "default", grace_period_seconds=5)
    assert shorter.metadata.deletion_grace_period_seconds == 5
    assert (kept.metadata.deletion_timestamp - shorter.metadata.deletion_timestamp).total_seconds() == 25
    core.delete_namespaced_pod("p1", "default", grace_period_seconds=0)  # the kubelet's confirmation
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_pod("p1", "default")
    assert exc.value.status == 404
    assert first.metadata.deletion_timestamp is not None


def test_an_unbound_a_finished_and_a_confirmed_pod_go_at_once_in_two_events(
    core: client.CoreV1Api, server: SimApiServer
) -> None:
    rv = str(server.store.resource_version)
    core.create_namespaced_pod("default", pod_body("unbound", node=None))
    core.delete_namespaced_pod("unbound", "default")
    core.create_namespaced_pod("default", pod_body("done"))
    pod = core.read_namespaced_pod("done", "default")
    pod.status.phase = "Succeeded"
    core.replace_namespaced_pod_status("done", "default", pod)
    core.delete_namespaced_pod("done", "default")
    core.create_namespaced_pod("default", pod_body("forced"))
    core.delete_namespaced_pod("forced", "default", grace_period_seconds=0)
    events = [
        (e["type"], e["object"].metadata.name, e["object"].metadata.deletion_grace_period_seconds)
        for e in watch.Watch().stream(
            core.list_namespaced_pod, "default", resource_version=rv, timeout_seconds=1
        )
    ]
    assert events == [
        ("ADDED", "unbound", None),
        ("MODIFIED", "unbound", 0),
        ("DELETED", "unbound", 0),
        ("ADDED", "done", None),
        ("MODIFIED", "done", None),
        ("MODIFIED", "done", 0),
        ("DELETED", "done", 0),
        ("ADDED", "forced", None),
        ("MODIFIED", "forced", 0),
        ("DELETED", "forced", 0),
    ]
    assert core.list_namespaced_pod("default").items == []


def test_a_status_write_does_not_end_a_graceful_delete_and_finalizers_answer_200(
    core: client.CoreV1Api,
) -> None:
    core.create_namespaced_pod("default", pod_body("p1"))
    core.delete_namespaced_pod("p1", "default")
    pod = core.read_namespaced_pod("p1", "default")
    pod.status.phase = "Running"
    assert core.replace_namespaced_pod_status("p1", "default", pod).metadata.deletion_timestamp is not None
    assert core.read_namespaced_pod("p1", "default").metadata.deletion_grace_period_seconds == 30
    node = {"metadata": {"name": "n8", "finalizers": ["example.com/x"]}}
    core.create_node(node)
    _, code, _ = core.delete_node_with_http_info("n8")  # the Node comes back, not a Status
    assert code == 200 and core.read_node("n8").metadata.deletion_timestamp is not None
    core.patch_node("n8", {"metadata": {"finalizers": None}})  # the last finalizer: gone
    with pytest.raises(ApiException) as exc:
        core.read_node("n8")
    assert exc.value.status == 404


def test_a_namespace_being_deleted_refuses_new_content_and_goes_with_its_content() -> None:
    store = Store(seed=1)
    store.ensure_namespace("ns1")
    store.create("pods", "ns1", pod_body("p1"))
    store.create(
        "pods", "ns1", {**pod_body("held"), "metadata": {"name": "held", "finalizers": ["example.com/x"]}}
    )
    store.delete("namespaces", None, "ns1")
    assert store.get("namespaces", None, "ns1")["status"]["phase"] == "Terminating"  # held by "held"
    assert [p["metadata"]["name"] for p in store.list("pods", "ns1")["items"]] == ["held"]
    with pytest.raises(Exception) as exc:
        store.create("pods", "ns1", pod_body("late"))
    assert getattr(exc.value, "code", None) == 403
    assert "unable to create new content in namespace ns1 because it is being terminated" in str(exc.value)
    store.patch("pods", "ns1", "held", {"metadata": {"finalizers": None}})
    store.delete("pods", "ns1", "held", grace_period_seconds=0)
    store.delete("namespaces", None, "ns1")
    assert store.list("namespaces")["items"] and "ns1" not in {
        n["metadata"]["name"] for n in store.list("namespaces")["items"]
    }


def test_a_restored_object_keeps_its_status_and_skips_admission() -> None:
    store = Store(seed=1)
    pod = pod_body("p1")
    pod["metadata"]["namespace"] = "restored"
    store.ensure_namespace("restored")
    got = store.create("pods", "restored", pod, restore=True)
    assert got["status"]["podIP"] == "10.0.0.1"
