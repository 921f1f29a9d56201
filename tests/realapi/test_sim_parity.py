"""The simulated API server answers as the real one: the same requests sent to both, the answers compared.

Each step is a request whose answer the fast tier relies on the simulator to get right (admission, a new
pod's status, graceful deletion, a pod's delete in two events, finalizers, a namespace's delete, a path
nobody serves, a built-in list's items).  Only what a client could act on is compared (status code,
reason, message, the fields named in the step), not what the simulator leaves out on purpose (the real
server's defaulted pod spec, managedFields, uids, timestamps): docs/real-apiserver.md.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import pytest

from lab.apiserver.apiserver import SimApiServer
from lab.apiserver.store import Store
from lab.cluster.restapi import RestStore
from lab.realapi import RealCluster
from tests.lab.apiserver.test_real_server_semantics import pod_body as _pod

Answer = tuple[int, Any]


def _send(store: RestStore, method: str, path: str, body: Any = None, **query: str) -> tuple[int, Any, str]:
    """(status, parsed body or text, content type) of one request: no error raised for a 4xx."""
    return store.send(method, path, body, query or None)


def _status(doc: Any) -> Any:
    return {k: doc.get(k) for k in ("kind", "reason", "message", "details")} if isinstance(doc, dict) else doc


def _meta(doc: Any, *keys: str) -> dict[str, Any]:
    meta = (doc or {}).get("metadata") or {}
    return {k: meta.get(k) for k in keys}


def _watch(store: RestStore, path: str, rv: str) -> list[tuple[str, str, Any]]:
    """The pod events since `rv` (a watch that ends after a second)."""
    url = store.server + path + "?" + urlencode({"watch": "1", "resourceVersion": rv, "timeoutSeconds": "1"})
    resp = store._http.request("GET", url, headers=store._headers)
    out = []
    for line in resp.data.splitlines():
        if line.strip():
            event = json.loads(line)
            meta = event["object"]["metadata"]
            out.append((event["type"], meta["name"], meta.get("deletionGracePeriodSeconds")))
    return out


def _steps(store: RestStore, ns: str) -> Iterator[tuple[str, Any]]:
    """The requests, each with the part of its answer the two servers must agree on."""
    gone = f"gone-{ns}"
    code, doc, _ = _send(store, "POST", f"/api/v1/namespaces/{gone}/pods", _pod("p1"))
    yield "pod in a missing namespace", (code, _status(doc))
    policy = {"apiVersion": "crd.projectcalico.org/v1", "kind": "NetworkPolicy", "metadata": {"name": "x"}}
    code, doc, _ = _send(
        store, "POST", f"/apis/crd.projectcalico.org/v1/namespaces/{gone}/networkpolicies", policy
    )
    yield "custom resource in a missing namespace", (code, _status(doc))
    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "l"}, "spec": {}}
    code, doc, _ = _send(store, "PUT", f"/apis/coordination.k8s.io/v1/namespaces/{gone}/leases/l", lease)
    yield "lease created by PUT in a missing namespace", (code, _status(doc))

    code, doc, _ = _send(store, "POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
    yield "namespace created", (code, doc["metadata"].get("labels"), doc.get("spec"), doc.get("status"))
    # The tier's server has no service account controller: its `default` is made here (409 on the simulator).
    _send(store, "POST", f"/api/v1/namespaces/{ns}/serviceaccounts", {"metadata": {"name": "default"}})
    code, doc, _ = _send(
        store, "POST", f"/api/v1/namespaces/{ns}/pods", _pod("p0", serviceAccountName="other")
    )
    yield "pod whose service account is missing", (code, _status(doc))

    pods = f"/api/v1/namespaces/{ns}/pods"
    code, doc, _ = _send(store, "POST", pods, _pod("p1"))
    yield "new pod, sent Running with IPs", (code, doc.get("status"), _meta(doc, "generation"))
    for name, resources in (
        ("burstable", {"requests": {"cpu": "1"}}),
        ("guaranteed", {"limits": {"cpu": "1", "memory": "1Gi"}}),
    ):
        body = _pod(name)
        body["spec"]["containers"][0]["resources"] = resources
        code, doc, _ = _send(store, "POST", pods, body)
        yield f"new {name} pod", (code, doc.get("status"))

    code, doc, _ = _send(store, "DELETE", f"{pods}/p1")
    yield "bound pod deleted", (code, doc.get("kind"), _meta(doc, "deletionGracePeriodSeconds", "generation"))
    code, kept, _ = _send(store, "GET", f"{pods}/p1")
    yield "bound pod still there", (code, _meta(kept, "deletionGracePeriodSeconds"))
    code, doc, _ = _send(store, "DELETE", f"{pods}/p1")
    same = _meta(doc, "resourceVersion") == _meta(kept, "resourceVersion")
    yield "deleted again without a grace period: unchanged", (code, same)
    code, doc, _ = _send(store, "DELETE", f"{pods}/p1", {"gracePeriodSeconds": 5})
    yield "deleted with a shorter grace period", (code, _meta(doc, "deletionGracePeriodSeconds"))
    kept["status"] = {"phase": "Running"}
    code, doc, _ = _send(store, "PUT", f"{pods}/p1/status", kept | {"metadata": doc["metadata"]})
    yield (
        "status written while terminating",
        (code, bool(_meta(doc, "deletionTimestamp")["deletionTimestamp"])),
    )
    code, doc, _ = _send(store, "DELETE", f"{pods}/p1", {"gracePeriodSeconds": 0})
    yield "the kubelet's confirmation", (code, _meta(doc, "deletionGracePeriodSeconds"))
    code, doc, _ = _send(store, "GET", f"{pods}/p1")
    yield "confirmed pod gone", (code, _status(doc))

    _, listed, _ = _send(store, "GET", pods)
    rv = listed["metadata"]["resourceVersion"]
    yield "list items carry no kind", (sorted(set(listed["items"][0]) & {"kind", "apiVersion"}),)
    _send(store, "POST", pods, _pod("unbound", node=None))
    _send(store, "DELETE", f"{pods}/unbound")
    _, done, _ = _send(store, "POST", pods, _pod("done"))
    done["status"] = {"phase": "Succeeded"}
    _send(store, "PUT", f"{pods}/done/status", done)
    _send(store, "DELETE", f"{pods}/done")
    _send(store, "POST", pods, _pod("forced"))
    _send(store, "DELETE", f"{pods}/forced", {"gracePeriodSeconds": 0})
    yield "events of three deletes", _watch(store, pods, rv)

    node = f"n-{ns}"
    _send(store, "POST", "/api/v1/nodes", {"metadata": {"name": node, "finalizers": ["example.com/x"]}})
    code, doc, _ = _send(store, "DELETE", f"/api/v1/nodes/{node}")
    yield (
        "node held by a finalizer",
        (code, doc.get("kind"), bool(_meta(doc, "deletionTimestamp")["deletionTimestamp"])),
    )
    resp = store._http.request(
        "PATCH",
        f"{store.server}/api/v1/nodes/{node}",
        body=json.dumps({"metadata": {"finalizers": None}}).encode(),
        headers=dict(store._headers) | {"Content-Type": "application/merge-patch+json"},
    )
    code, doc, _ = _send(store, "GET", f"/api/v1/nodes/{node}")
    yield "node gone with its last finalizer", (resp.status, code)

    for name in ("burstable", "guaranteed"):
        _send(store, "DELETE", f"{pods}/{name}", {"gracePeriodSeconds": 0})
    code, doc, _ = _send(store, "DELETE", f"/api/v1/namespaces/{ns}")
    yield "namespace deleted", (code, doc.get("kind"), (doc.get("status") or {}).get("phase"))

    code, doc, ctype = _send(store, "GET", "/apis/nobody.example.com/v1/things")
    yield "a group nobody serves", (code, ctype, doc)


def _normalised(answer: Any, ns: str) -> Any:
    """The answer with the step's random namespace name taken out (each server got its own)."""
    return json.loads(json.dumps(answer).replace(ns, "NS"))


@pytest.fixture
def sim_store() -> Iterator[RestStore]:
    with SimApiServer(Store()) as server:
        store = RestStore(server.url, "unused", None)
        try:
            yield store
        finally:
            store.close()


def test_the_simulator_answers_as_the_real_server(real_v1: RealCluster, sim_store: RestStore) -> None:
    real_store = real_v1.store()
    try:
        ns_real, ns_sim = f"parity-{uuid.uuid4().hex[:8]}", f"parity-{uuid.uuid4().hex[:8]}"
        real = [(what, _normalised(a, ns_real)) for what, a in _steps(real_store, ns_real)]
        sim = [(what, _normalised(a, ns_sim)) for what, a in _steps(sim_store, ns_sim)]
    finally:
        real_store.close()
    differ = [
        f"{what}:\n  real      {r}\n  simulator {s}"
        for (what, r), (_, s) in zip(real, sim, strict=True)
        if r != s
    ]
    assert not differ, "the simulator answers otherwise than kube-apiserver:\n" + "\n".join(differ)
    assert len(real) == 21
