"""The simulated cluster's actors on any Kubernetes API server: the store interface they write through,
spoken over HTTP.

Why it exists: `SimCluster`, its CNI, the bulk loader, the churn and the KubeVirt driver write through a
narrow store interface (get / create / replace / delete / list, plus a commit hook on IPAMBlock writes
that keeps the ground truth).  In-process that is the simulated API server's own `Store`; `RestStore`
gives the same interface over REST, so the same actors drive a real kube-apiserver (tests/realapi) and
their ground truth stays with them.

The simulated store has the real server's admission and strategies (a namespace must exist, a new pod
is Pending, a pod's DELETE is graceful: docs/real-apiserver.md), so the actors act alike on both.  What
the tier's real server still needs (done here, as the cluster's controllers would):
- a namespace's ServiceAccount `default` (admission `ServiceAccount`), which the service account
  controller makes in a cluster (none runs in the tier; the simulated store makes it): `ensure_namespace`
  creates the namespace and its account;
- a restored pod (`create(..., restore=True)`, the bulk loader's) keeps its status: a real server makes
  every new pod Pending, so the status is written through `/status` right after, as the kubelet reports
  it (the simulated store keeps a restored object's status as given);
- Calico objects are stamped with the kind and apiVersion of the group the server serves (as the
  simulated store does);
- managedFields are the server's: the actors put them in the objects they give the simulated store
  (a real-size pod's, `lab.cluster.podshape`), and a real server keeps its own, from the field manager
  each request names (`field_manager`: the `fieldManager` parameter), so they are left out of the body.

The commit hook sees every IPAMBlock change: the actors' own writes synchronously (old = the version
their write was conditioned on), everybody else's (ipamgc's releases) from a watch, in resourceVersion
order; `settle()` waits until the watch has seen every block as the server now has it (`BlockHook`, in
`lab.cluster.resthook`, which `RestStore` extends).
"""

from __future__ import annotations

import builtins
import ssl
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote, urlencode

import orjson
import urllib3

from lab.apiserver.store import SimApiError
from lab.cluster.resthook import BlockHook
from shared.calicogroup import PLURALS as CALICO_PLURALS
from shared.calicogroup import V1, CalicoGroup

__all__ = ["RestStore"]

JsonObj = dict[str, Any]

CORE = {"nodes": "Node", "pods": "Pod", "namespaces": "Namespace", "serviceaccounts": "ServiceAccount"}
KUBEVIRT = {"virtualmachines": "VirtualMachine", "virtualmachineinstances": "VirtualMachineInstance"}
COORDINATION = {"leases": "Lease"}
NAMESPACED = {"pods", "serviceaccounts", "virtualmachines", "virtualmachineinstances", "leases"}
#: The field manager of a restored pod's status write (the kubelet reports a pod's status).
KUBELET = "kubelet"
#: Requests `create_many` (the bulk loader's sweep) keeps in flight: on the 2-core machines of
#: docs/benchmarks.md one connection at a time left a core idle while the driver encoded the next pod;
#: the connection pool holds as many (`maxsize`).
BULK_IN_FLIGHT = 8


def _manager(field_manager: str | None) -> dict[str, str] | None:
    """The query naming a write's field manager (none: the server names it after the user agent)."""
    return {"fieldManager": field_manager} if field_manager else None


class RestStore(BlockHook):
    """`Store`'s actor-facing verbs over HTTP (bearer token, CA-verified TLS); its hook: `BlockHook`."""

    def __init__(
        self,
        server: str,
        token: str,
        ca_file: str | None,
        calico: CalicoGroup = V1,
        timeout: float = 30.0,
    ) -> None:
        self.server = server.rstrip("/")
        self.calico = calico
        self._headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        ctx = ssl.create_default_context(cafile=ca_file) if ca_file else None
        self._http = urllib3.PoolManager(
            maxsize=BULK_IN_FLIGHT + 1,  # and the block watch's (`BlockHook`)
            ssl_context=ctx,
            timeout=urllib3.Timeout(connect=5.0, read=timeout),
            # a refused or dropped connection (a restarting server) is retried; a sent request never is
            retries=urllib3.Retry(
                total=8, connect=8, read=0, redirect=0, status=0, other=0, backoff_factor=0.25
            ),
        )
        super().__init__()  # the commit hook's state (`BlockHook`)
        self._ns_ready: set[str] = set()
        self._served: dict[str, bool] = {}

    # -- paths ------------------------------------------------------------------------------------------

    def _base(self, plural: str) -> tuple[str, str, str]:
        """(path prefix, apiVersion, kind) of a resource the actors name by its v1 plural."""
        if plural in CORE:
            return "/api/v1", "v1", CORE[plural]
        if plural in COORDINATION:
            return "/apis/coordination.k8s.io/v1", "coordination.k8s.io/v1", COORDINATION[plural]
        if plural in KUBEVIRT:
            return "/apis/kubevirt.io/v1", "kubevirt.io/v1", KUBEVIRT[plural]
        if plural in CALICO_PLURALS:
            return f"/apis/{self.calico.api_version}", self.calico.api_version, self.calico.kind(plural)
        raise ValueError(f"resource {plural!r} is not one the actors write")

    def _path(
        self, plural: str, namespace: str | None, name: str | None = None, sub: str | None = None
    ) -> str:
        prefix, _, _ = self._base(plural)
        served = self.calico.plural(plural) if plural in CALICO_PLURALS else plural
        path = prefix
        if namespace and plural in NAMESPACED:
            path += f"/namespaces/{quote(namespace, safe='')}"
        path += f"/{served}"
        if name is not None:
            path += f"/{quote(name, safe='')}"
        if sub:
            path += f"/{sub}"
        return path

    def send(
        self, method: str, path: str, body: Any = None, query: Mapping[str, str] | None = None
    ) -> tuple[int, Any, str]:
        """One request as sent, whatever its answer: (status, the body parsed as JSON or else as text,
        the content type).  `tests/realapi/test_sim_parity.py` compares two servers' answers with it."""
        url = self.server + path + (f"?{urlencode(query)}" if query else "")
        headers = dict(self._headers)
        data = None
        if body is not None:
            data = orjson.dumps(body)
            headers["Content-Type"] = "application/json"
        resp = self._http.request(method, url, body=data, headers=headers)
        ctype = str(resp.headers.get("Content-Type", "")).split(";")[0]
        try:
            doc: Any = orjson.loads(resp.data) if resp.data else None
        except ValueError:
            doc = resp.data.decode(errors="replace")
        return int(resp.status), doc, ctype

    def _request(
        self, method: str, path: str, body: Any = None, query: Mapping[str, str] | None = None
    ) -> JsonObj:
        status, answer, _ = self.send(method, path, body, query)
        doc: JsonObj = answer if isinstance(answer, dict) else {}
        if status >= 400:
            raise SimApiError(
                status,
                str(doc.get("reason") or "Unknown"),
                str(doc.get("message") or str(answer or "")[:200]),
                details=doc.get("details") or {},
            )
        return doc

    def _stamp(self, plural: str, body: Mapping[str, Any]) -> JsonObj:
        obj = dict(body)  # the caller's object is left as given: the top level and metadata are copied,
        if isinstance(obj.get("metadata"), Mapping):  # the only parts written here
            obj["metadata"] = dict(obj["metadata"])
        _, api_version, kind = self._base(plural)
        obj["apiVersion"], obj["kind"] = api_version, kind
        return obj

    # -- the Store verbs the actors use ------------------------------------------------------------------

    def get(self, resource: str, namespace: str | None, name: str, *, copy: bool = True) -> JsonObj:
        obj = self._request("GET", self._path(resource, namespace, name))
        if resource == "ipamblocks":
            self._remember(obj)
        return obj

    def list(self, resource: str, namespace: str | None = None, **_: Any) -> JsonObj:
        """Every object, page by page (500 a page), each item with its kind and apiVersion as kubectl
        prints them (a real server leaves them out of a built-in type's list items)."""
        _prefix, api_version, kind = self._base(resource)
        items: builtins.list[JsonObj] = []
        query = {"limit": "500"}
        while True:
            page = self._request("GET", self._path(resource, namespace), query=query)
            for item in page.get("items") or []:
                item.setdefault("apiVersion", api_version)
                item.setdefault("kind", kind)
                items.append(item)
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                break
            query = {"limit": "500", "continue": token}
        meta = {"resourceVersion": (page.get("metadata") or {}).get("resourceVersion", "")}
        return {"apiVersion": api_version, "kind": f"{kind}List", "metadata": meta, "items": items}

    def count(self, resource: str) -> int:
        return len(self.list(resource)["items"])

    def serves(self, plural: str) -> bool:
        if plural not in self._served:
            prefix, _, _ = self._base(plural)
            try:
                doc = self._request("GET", prefix)
            except SimApiError as exc:
                if exc.code != 404:
                    raise
                doc = {}
            names = {r.get("name") for r in doc.get("resources") or []}
            served = self.calico.plural(plural) if plural in CALICO_PLURALS else plural
            self._served[plural] = served in names
        return self._served[plural]

    def create(
        self,
        resource: str,
        namespace: str | None,
        body: Mapping[str, Any],
        *,
        copy: bool = True,
        restore: bool = False,
        field_manager: str | None = None,
        **_: Any,
    ) -> JsonObj:
        obj = self._stamp(resource, body)
        meta = obj.setdefault("metadata", {})
        for server_owned in ("uid", "resourceVersion", "creationTimestamp", "managedFields"):
            meta.pop(server_owned, None)  # a real server refuses a resourceVersion and sets the others
        if resource in NAMESPACED:
            namespace = namespace or meta.get("namespace")
            self.ensure_namespace(str(namespace))
        query = _manager(field_manager)
        if resource == "pods" and obj.get("status") and restore:
            # `restore` (the bulk loader's): the pod as given, status included; a real server drops a new
            # pod's status (Pending, no IPs), so it is written through /status, as the kubelet reports it.
            created = self._request("POST", self._path(resource, namespace), obj, query)
            created["status"] = obj["status"]
            path = self._path(resource, namespace, meta["name"], "status")
            return self._request("PUT", path, created, _manager(KUBELET if field_manager else None))
        if resource != "ipamblocks":
            return self._request("POST", self._path(resource, namespace), obj, query)
        with self._lock:
            created = self._request("POST", self._path(resource, namespace), obj, query)
            self._own_write("ADDED", None, created)
            return created

    def create_many(self, resource: str, objs: Iterable[Mapping[str, Any]], **kwargs: Any) -> None:
        """`create` for every object of `objs` (each in the namespace its metadata names), `BULK_IN_FLIGHT`
        requests at a time, each still one client request of its own; the first failure is raised once
        the requests in flight have ended."""

        def one(obj: Mapping[str, Any]) -> None:
            self.create(resource, (obj.get("metadata") or {}).get("namespace"), obj, **kwargs)

        pool = ThreadPoolExecutor(BULK_IN_FLIGHT, thread_name_prefix="rest-bulk")
        try:
            for _ in pool.map(one, objs):
                pass
        finally:  # after a failure the objects not sent yet are dropped, not sent
            pool.shutdown(wait=True, cancel_futures=True)

    def replace(
        self,
        resource: str,
        namespace: str | None,
        name: str,
        body: Mapping[str, Any],
        *,
        subresource: str | None = None,
        field_manager: str | None = None,
        **_: Any,
    ) -> JsonObj:
        obj = self._stamp(resource, body)
        obj.get("metadata", {}).pop("managedFields", None)  # the server keeps its own (see above)
        path = self._path(resource, namespace, name, subresource)
        query = _manager(field_manager)
        if resource != "ipamblocks":
            return self._request("PUT", path, obj, query)
        with self._lock:
            old = self._version(name, str((obj.get("metadata") or {}).get("resourceVersion") or ""))
            new = self._request("PUT", path, obj, query)
            self._own_write("MODIFIED", old, new)
            return new

    def delete(
        self,
        resource: str,
        namespace: str | None,
        name: str,
        *,
        preconditions: Mapping[str, Any] | None = None,
        grace_period_seconds: int | None = None,
        **_: Any,
    ) -> JsonObj:
        options: JsonObj = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if preconditions:
            options["preconditions"] = {k: v for k, v in preconditions.items() if v is not None}
        if grace_period_seconds is not None:
            options["gracePeriodSeconds"] = grace_period_seconds
        path = self._path(resource, namespace, name)
        if resource != "ipamblocks":
            return self._request("DELETE", path, options)
        with self._lock:
            want = str((preconditions or {}).get("resourceVersion") or self._latest.get(name, ""))
            old = self._version(name, want)
            gone = self._request("DELETE", path, options)
            self._own_write("DELETED", old, gone)
            return gone

    def ensure_namespace(self, namespace: str) -> None:
        """The namespace and its ServiceAccount `default` (what the namespace controller and the token
        controller would make), created once."""
        if namespace in self._ns_ready:
            return
        for plural, ns, body in (
            ("namespaces", None, {"metadata": {"name": namespace}}),
            ("serviceaccounts", namespace, {"metadata": {"name": "default", "namespace": namespace}}),
        ):
            try:
                self._request("POST", self._path(plural, ns), self._stamp(plural, body))
            except SimApiError as exc:
                if exc.code != 409 and not (exc.code == 404 and plural == "serviceaccounts"):
                    raise  # 404: a server that serves no ServiceAccounts (the simulated one) needs none
        self._ns_ready.add(namespace)
