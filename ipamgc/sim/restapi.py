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
  (a real-size pod's, `ipamgc.sim.podshape`), and a real server keeps its own, from the field manager
  each request names (`field_manager`: the `fieldManager` parameter), so they are left out of the body.

The commit hook sees every IPAMBlock change: the actors' own writes synchronously (old = the version
their write was conditioned on), everybody else's (ipamgc's releases) from a watch, in resourceVersion
order; `settle()` waits until the watch has seen every block as the server now has it.
"""

from __future__ import annotations

import builtins
import contextlib
import copy
import json
import logging
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote, urlencode

import urllib3

from ipamgc.sim.store import SimApiError
from shared.calicogroup import PLURALS as CALICO_PLURALS
from shared.calicogroup import V1, CalicoGroup

__all__ = ["RestStore"]

log = logging.getLogger(__name__)

JsonObj = dict[str, Any]
CommitHook = Callable[[str, str, Mapping[str, Any] | None, Mapping[str, Any] | None], None]

CORE = {"nodes": "Node", "pods": "Pod", "namespaces": "Namespace", "serviceaccounts": "ServiceAccount"}
KUBEVIRT = {"virtualmachines": "VirtualMachine", "virtualmachineinstances": "VirtualMachineInstance"}
COORDINATION = {"leases": "Lease"}
NAMESPACED = {"pods", "serviceaccounts", "virtualmachines", "virtualmachineinstances", "leases"}
#: Versions of one IPAMBlock remembered for the hook (the actors' writes are conditioned on recent ones).
KEEP_VERSIONS = 16
#: The field manager of a restored pod's status write (the kubelet reports a pod's status).
KUBELET = "kubelet"


def _manager(field_manager: str | None) -> dict[str, str] | None:
    """The query naming a write's field manager (none: the server names it after the user agent)."""
    return {"fieldManager": field_manager} if field_manager else None


class RestStore:
    """`Store`'s actor-facing verbs over HTTP (bearer token, CA-verified TLS)."""

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
            maxsize=8,
            ssl_context=ctx,
            timeout=urllib3.Timeout(connect=5.0, read=timeout),
            # a refused or dropped connection (a restarting server) is retried; a sent request never is
            retries=urllib3.Retry(
                total=8, connect=8, read=0, redirect=0, status=0, other=0, backoff_factor=0.25
            ),
        )
        self._hooks: list[CommitHook] = []
        self._lock = threading.RLock()  # own IPAMBlock writes and watch events, one at a time
        self._blocks: dict[str, dict[str, JsonObj]] = {}  # name → resourceVersion → object
        self._latest: dict[str, str] = {}  # name → newest resourceVersion seen ("" once deleted)
        self._own: set[str] = set()  # resourceVersions the actors' own block writes produced
        self._ns_ready: set[str] = set()
        self._served: dict[str, bool] = {}
        self._stop = threading.Event()
        self._watch_thread: threading.Thread | None = None
        self._response: Any = None
        self.watch_restarts = 0  # relists after a 410 or a broken stream (the compaction test reads it)

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
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        resp = self._http.request(method, url, body=data, headers=headers)
        ctype = str(resp.headers.get("Content-Type", "")).split(";")[0]
        try:
            doc: Any = json.loads(resp.data) if resp.data else None
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
        obj = copy.deepcopy(dict(body))
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

    # -- the commit hook ----------------------------------------------------------------------------------

    def add_hook(self, hook: CommitHook) -> None:
        """Call `hook(plural, event, old, new)` for every IPAMBlock change; starts the watch on first use."""
        self._hooks.append(hook)
        if self._watch_thread is None:
            rv = self._relist(notify=False)
            self._watch_thread = threading.Thread(
                target=self._watch_loop, args=(rv,), name="reststore-ipamblocks", daemon=True
            )
            self._watch_thread.start()

    def _remember(self, obj: JsonObj) -> None:
        meta = obj.get("metadata") or {}
        name, rv = str(meta.get("name")), str(meta.get("resourceVersion"))
        with self._lock:
            versions = self._blocks.setdefault(name, {})
            versions[rv] = copy.deepcopy(obj)  # the caller may change what it got before writing it back
            while len(versions) > KEEP_VERSIONS:
                versions.pop(next(iter(versions)))

    def _version(self, name: str, rv: str) -> JsonObj | None:
        return copy.deepcopy(self._blocks.get(name, {}).get(rv))

    def _own_write(self, event: str, old: JsonObj | None, new: JsonObj) -> None:
        meta = new.get("metadata") or {}
        name, rv = str(meta.get("name")), str(meta.get("resourceVersion") or "")
        self._own.add(rv)
        if event == "DELETED":
            self._latest[name] = ""
            self._blocks.pop(name, None)
        else:
            self._latest[name] = rv
            self._remember(new)
        self._notify(event, old, new)

    def _notify(self, event: str, old: JsonObj | None, new: JsonObj | None) -> None:
        for hook in self._hooks:
            hook("ipamblocks", event, old, new)

    def _relist(self, notify: bool) -> str:
        """List the blocks; with `notify`, report every change since the last known versions."""
        page = self.list("ipamblocks")
        with self._lock:
            seen: set[str] = set()
            for obj in page["items"]:
                meta = obj["metadata"]
                name, rv = meta["name"], meta["resourceVersion"]
                seen.add(name)
                prev = self._latest.get(name)
                if prev == rv:
                    continue
                old = self._version(name, prev) if prev else None
                self._latest[name] = rv
                self._remember(obj)
                if notify:
                    self._notify("MODIFIED" if old else "ADDED", old, obj)
            for name, rv in list(self._latest.items()):
                if rv and name not in seen:
                    old = self._version(name, rv)
                    self._latest[name] = ""
                    self._blocks.pop(name, None)
                    if notify:
                        self._notify("DELETED", old, old)
        return str(page["metadata"]["resourceVersion"])

    def _watch_loop(self, rv: str) -> None:
        while not self._stop.is_set():
            try:
                rv = self._watch_once(rv)
            except Exception as exc:  # noqa: BLE001  (any broken stream: relist, as an informer does)
                if self._stop.is_set():
                    return
                log.info("ipamblock watch ended (%s): relisting", exc)
                self.watch_restarts += 1
                try:
                    rv = self._relist(notify=True)
                except Exception as relist_exc:  # noqa: BLE001
                    log.info("relist failed (%s): retrying", relist_exc)
                    self._stop.wait(0.5)

    def _watch_once(self, rv: str) -> str:
        query = {"watch": "1", "resourceVersion": rv, "allowWatchBookmarks": "true", "timeoutSeconds": "60"}
        url = self.server + self._path("ipamblocks", None) + "?" + urlencode(query)
        resp = self._http.request(
            "GET", url, headers=self._headers, preload_content=False, timeout=urllib3.Timeout(read=90.0)
        )
        self._response = resp
        try:
            if resp.status >= 400:
                raise SimApiError(resp.status, "WatchFailed", resp.read()[:200].decode(errors="replace"))
            buf = b""
            for chunk in resp.stream(65536):
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        rv = self._event(json.loads(line), rv)
            return rv
        finally:
            resp.release_conn()

    def _event(self, ev: JsonObj, rv: str) -> str:
        kind, obj = ev.get("type"), ev.get("object") or {}
        if kind == "ERROR":
            raise SimApiError(int(obj.get("code") or 500), str(obj.get("reason")), str(obj.get("message")))
        meta = obj.get("metadata") or {}
        new_rv = str(meta.get("resourceVersion") or rv)
        if kind == "BOOKMARK":
            return new_rv
        name = str(meta.get("name"))
        with self._lock:
            if new_rv in self._own:
                self._own.discard(new_rv)
                return new_rv
            prev = self._latest.get(name)
            old = self._version(name, prev) if prev else None
            if kind == "DELETED":
                self._latest[name] = ""
                self._blocks.pop(name, None)
                self._notify("DELETED", old, obj)
            else:
                self._latest[name] = new_rv
                self._remember(obj)
                self._notify(str(kind), old, obj)
        return new_rv

    def settle(self, timeout: float = 30.0) -> None:
        """Wait until the hook has seen every IPAMBlock as the server has it now (polled, with a deadline)."""
        deadline = time.monotonic() + timeout
        while True:
            now = {
                o["metadata"]["name"]: o["metadata"]["resourceVersion"]
                for o in self.list("ipamblocks")["items"]
            }
            with self._lock:
                known = {n: rv for n, rv in self._latest.items() if rv}
            if known == now:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the IPAMBlock watch did not catch up: {len(now)} on the server")
            self._stop.wait(0.05)

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(Exception):
            if self._response is not None:
                self._response.shutdown()
        if self._watch_thread is not None:
            self._watch_thread.join(timeout=10)
        self._http.clear()
