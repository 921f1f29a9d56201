"""The simulated API server keeps server-owned metadata as a real one does (issue 13, item 3).

Clients cannot change or drop `uid`, `creationTimestamp`, `generation` or a pending `deletionTimestamp`:
a PUT or a PATCH over real HTTP with the official client leaves them as the server set them, so a test
judged against the simulator sees a terminating pod stay terminating.
"""

from __future__ import annotations

from kubernetes import client as k8s

from lab.apiserver.apiserver import SimApiServer
from lab.apiserver.store import Store

OWNED = ("uid", "creationTimestamp", "generation", "deletionTimestamp")


def test_put_and_patch_keep_server_owned_metadata_of_a_terminating_pod() -> None:
    store = Store(seed=3)
    pod = {
        "metadata": {"name": "p", "finalizers": ["example.com/hold"]},
        "spec": {"nodeName": "n", "containers": [{"name": "c", "image": "i"}]},
    }
    store.ensure_namespace("ns")
    store.create("pods", "ns", pod)
    store.delete("pods", "ns", "p")  # terminating: the finalizer holds it
    with SimApiServer(store) as server:
        api_client = server.api_client()
        try:
            core = k8s.CoreV1Api(api_client)
            before = store.get("pods", "ns", "p")["metadata"]
            assert all(before.get(f) for f in OWNED)
            body = api_client.sanitize_for_serialization(core.read_namespaced_pod("p", "ns"))
            meta = body["metadata"]
            meta.pop("deletionTimestamp")
            meta.update(uid="forged", creationTimestamp="2000-01-01T00:00:00Z", generation=99)
            meta["labels"] = {"changed": "yes"}  # a real change, so the write is not a no-op
            core.replace_namespaced_pod("p", "ns", body)
            after = store.get("pods", "ns", "p")["metadata"]
            assert {f: after.get(f) for f in OWNED} == {f: before.get(f) for f in OWNED}
            assert after["labels"] == {"changed": "yes"}
            patch = {"metadata": {"deletionTimestamp": None, "uid": "forged-again", "generation": 7}}
            core.patch_namespaced_pod("p", "ns", patch)
            assert {f: store.get("pods", "ns", "p")["metadata"].get(f) for f in OWNED} == {
                f: before.get(f) for f in OWNED
            }
        finally:
            api_client.close()
