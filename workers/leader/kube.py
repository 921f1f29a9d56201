"""The leader's Kubernetes calls: single-object reads and conditional writes, raw JSON over `kubeio`.

The leader reads single objects (a node, a pod, a block, a handle, an affinity), lists a host's
BlockAffinities by label, lists every IPAMHandle and IPAMBlock in pages (the handle collector's scan),
and writes IPAMBlocks, IPAMHandles and BlockAffinities conditionally: replace with the resourceVersion it
read (409 when someone wrote in between), delete with preconditions (uid + resourceVersion), and create
(409 when the object exists: only the handle collector creates, a missing IPAMHandle).  Those
conditions, not our own election, are what makes a write safe: the API server is the real fence.
Requests are raw JSON over the client's configuration and pool (`kubeio.http`: a release is ~9
requests, and the generated methods cost ~70 µs each on top of the HTTP exchange), never the client's
models, and every failure becomes a `shared.errors` error here.  The Lease
of the leader election is `kubeio.lease.Lease` (`lease_candidate`), bound to our ApiClient.
"""

from __future__ import annotations

import logging
from typing import Any

from kubeio.calico import CalicoGroupOf
from kubeio.client import ApiClient
from kubeio.errors import ApiUnavailable, translate
from kubeio.http import ApiError, Http, path_part
from kubeio.lease import Lease
from shared.calicogroup import CalicoGroup

log = logging.getLogger("workers.kube")  # its pre-split name (#37): log lines unchanged


KUBEVIRT_GROUP = "kubevirt.io"
KUBEVIRT_VERSION = "v1"
JsonObj = dict[str, Any]


class CalicoApi:
    """Single-object reads and conditional writes, raw JSON in and out.

    Calico's objects are named by their crd.projectcalico.org/v1 plurals (`ipamconfigs`) and read and
    written in `calico`, the configured group, else the one the server's `/apis` says
    (`shared.calicogroup.choose`), asked at the first Calico call and kept; a failed discovery is that
    call's error (retried by its caller), never a guess."""

    def __init__(
        self,
        api: ApiClient,
        *,
        timeout: tuple[float, float] = (10.0, 30.0),
        calico: CalicoGroup | None = None,
    ) -> None:
        self._http = Http(api, timeout=timeout)
        self._calico_group = CalicoGroupOf(self._http, calico)

    def calico(self) -> CalicoGroup:
        """The API group of Calico's objects (see the class docstring)."""
        return self._calico_group.group()

    def _json(self, method: str, path: str, what: str, **kwargs: Any) -> JsonObj:
        try:
            return self._http.json(method, path, what=what, **kwargs)
        except ApiError as exc:
            raise translate(exc, what) from exc

    def _calico(self, plural: str, name: str | None = None) -> str:
        group = self.calico()
        base = f"/apis/{group.name}/{group.version}/{group.plural(plural)}"
        return base if name is None else f"{base}/{path_part(name)}"

    # -- core ---------------------------------------------------------------------------------------

    def get_node(self, name: str) -> JsonObj:
        return self._json("GET", f"/api/v1/nodes/{path_part(name)}", f"get node {name}")

    def get_pod(self, namespace: str, name: str) -> JsonObj:
        path = f"/api/v1/namespaces/{path_part(namespace)}/pods/{path_part(name)}"
        return self._json("GET", path, f"get pod {namespace}/{name}")

    # -- KubeVirt (kubevirt.io/v1, namespaced) -----------------------------------------------------------

    def kubevirt_installed(self) -> bool:
        """Whether the API server serves kubevirt.io/v1 (its `/apis` discovery document)."""
        doc = self._json("GET", "/apis", "discover API groups")
        for group in doc.get("groups") or []:
            if isinstance(group, dict) and group.get("name") == KUBEVIRT_GROUP:
                versions = group.get("versions") or []
                return any(isinstance(v, dict) and v.get("version") == KUBEVIRT_VERSION for v in versions)
        return False

    def get_kubevirt(self, plural: str, namespace: str, name: str) -> JsonObj:
        """A VirtualMachine or VirtualMachineInstance (`plural`)."""
        path = (
            f"/apis/{KUBEVIRT_GROUP}/{KUBEVIRT_VERSION}/namespaces/{path_part(namespace)}"
            f"/{plural}/{path_part(name)}"
        )
        return self._json("GET", path, f"get {plural}.{KUBEVIRT_GROUP} {namespace}/{name}")

    # -- Calico objects (cluster-scoped) -----------------------------------------------------------------

    def get(self, plural: str, name: str) -> JsonObj:
        return self._json("GET", self._calico(plural, name), f"get {plural}/{name}")

    def replace(self, plural: str, body: JsonObj) -> JsonObj:
        """PUT `body`, conditional on its `metadata.resourceVersion` (which callers always carry)."""
        name = body["metadata"]["name"]
        if not body["metadata"].get("resourceVersion"):
            raise ValueError(f"refusing an unconditional replace of {plural}/{name}")
        return self._json("PUT", self._calico(plural, name), f"replace {plural}/{name}", body=body)

    def delete(self, plural: str, name: str, uid: str, resource_version: str) -> None:
        """DELETE with preconditions: 409 unless the object is exactly the one we last wrote."""
        if not uid or not resource_version:
            raise ValueError(f"refusing a delete of {plural}/{name} without preconditions")
        options = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "preconditions": {"uid": uid, "resourceVersion": resource_version},
        }
        self._json("DELETE", self._calico(plural, name), f"delete {plural}/{name}", body=options)

    def create(self, plural: str, body: JsonObj) -> JsonObj:
        """POST `body`, which must carry no resourceVersion: 409 (AlreadyExists) when the object exists,
        the create's own precondition."""
        name = body["metadata"]["name"]
        if body["metadata"].get("resourceVersion"):
            raise ValueError(f"refusing to create {plural}/{name} with a resourceVersion")
        return self._json("POST", self._calico(plural), f"create {plural}/{name}", body=body)

    def list_page(self, plural: str, limit: int, cont: str = "") -> tuple[list[JsonObj], str]:
        """One page of every object of `plural` (`limit`/`continue`): its items and the continue token
        of the next page ("" after the last one).  A 410 (the token expired) is the caller's to restart."""
        query = {"limit": str(limit), **({"continue": cont} if cont else {})}
        body = self._json("GET", self._calico(plural), f"list {plural}", query=query)
        items = body.get("items") or []
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise ApiUnavailable(f"list {plural}: items is not a list of objects")
        meta = body.get("metadata") or {}
        return items, str(meta.get("continue") or "") if isinstance(meta, dict) else ""

    def list(self, plural: str, label_selector: str) -> list[JsonObj]:
        """Every object of `plural` matching `label_selector` (one page: a host has few affinities)."""
        body = self._json(
            "GET",
            self._calico(plural),
            f"list {plural} -l {label_selector}",
            query={"labelSelector": label_selector},
        )
        items = body.get("items") or []
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise ApiUnavailable(f"list {plural}: items is not a list of objects")
        return items


# -- the Lease --------------------------------------------------------------------------------------------


def lease_candidate(api: ApiClient, *, namespace: str, name: str, identity: str, lease_seconds: int) -> Lease:
    """The leader's Lease candidate on our ApiClient: one attempt at a time to acquire or renew it
    (`kubeio.lease.Lease`, client-go's algorithm; `release` empties the holder on a graceful stop).  The
    loop around it (interruptible waits, deadlines, stopping the work) is `workers.leader.election`'s."""
    return Lease(Http(api), namespace=namespace, name=name, identity=identity, lease_seconds=lease_seconds)
