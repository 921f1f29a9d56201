"""The watcher's API calls: Calico's group, paginated lists and watch streams, raw JSON in, bytes out.

Why it exists: the watcher reads every object of six kinds, and the generated client would cost it its
memory and CPU (design.md: the client's models took ~15 s and +1 GB for 10,000 pods).  The official
client is used for its configuration, authentication and connection pool only (`kubeio.client`,
`kubeio.http`); pages and watch events are read with msgspec or orjson, pods and IPAMBlocks straight into
slim structs (`producer.typed`).  Errors are `kubeio.errors`' tree.  What the watcher does with the
calls is `producer.reflector`; the kinds are `producer.kinds`.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator, Mapping
from typing import Any

import msgspec
import orjson
import urllib3

from kubeio import client as kubeio_client
from kubeio.calico import CalicoGroupOf
from kubeio.client import ApiClient
from kubeio.errors import KubeTransientError, translate
from kubeio.http import ApiError, Http
from kubeio.watch import Page, WatchStream
from producer import slim, slimpods
from producer.kinds import CORE_KINDS, FAST_KINDS, KUBEVIRT_KINDS, Kind
from producer.typed import fast_event, loads_item
from shared import kubevirt as kv
from shared.calicogroup import CalicoGroup

log = logging.getLogger(__name__)

# Connections kept to the API server: one per concurrent watch (six kinds, two more of KubeVirt's), plus
# the lists and the election's Lease.  The client's default is 5 per core: 5 on one core.
POOL_SIZE = 16
# A list page is read in pieces of this size into one growing buffer (`read_body`).
LIST_READ_SIZE = 1 << 20


def api_client(kubeconfig: str | None = None, context: str | None = None) -> ApiClient:
    """The watcher's ApiClient (`kubeio.client.api_client` with a pool for every watch at once)."""
    return kubeio_client.api_client(kubeconfig, context, pool_size=POOL_SIZE)


def list_calico_items(api: KubeApi, plural: str, timeout: tuple[float, float] = (10.0, 30.0)) -> list[object]:
    """Every object of a cluster-scoped Calico kind (`plural`: its crd.projectcalico.org/v1 name), as raw
    JSON (one unpaged list, no client models), in the group `api` chose: the small kinds the metrics
    read (IPPools, IPReservations).  An API failure is `translate`d."""
    group = api.calico()
    path = f"/apis/{group.name}/{group.version}/{group.plural(plural)}"
    try:
        body = orjson.loads(api.http.request("GET", path, what=f"list {plural}", timeout=timeout))
    except (ApiError, orjson.JSONDecodeError) as exc:
        raise translate(exc, f"list {plural}") from exc
    items = body.get("items") if isinstance(body, dict) else None
    return items if isinstance(items, list) else []


class KubeApi:
    """List and watch calls as raw requests over the official client's configuration and pool
    (`kubeio.http`), bodies read with msgspec or orjson (never models).  Not the generated API classes:
    `CoreV1Api` alone is a 63,000-line module whose import took 0.37 s and ~20 MiB of the watcher's
    resident memory (325 against 345–353 MiB peak after a 150k-pod list), for two of its methods.

    Calico's kinds are read in `calico`, the configured group, else the one the server's `/apis` says
    (`shared.calicogroup.choose`, asked once, at the first Calico call: a failure is raised to that
    call's retry, never guessed)."""

    def __init__(
        self,
        client: ApiClient,
        *,
        calico: CalicoGroup | None = None,
        page_size: int = 500,
        watch_timeout: int = 300,
        read_margin: float = 30.0,
        connect_timeout: float = 10.0,
        list_timeout: float = 60.0,
        gulp: float = 0.25,
    ) -> None:
        self.http = Http(client, timeout=(connect_timeout, list_timeout))
        self._calico = CalicoGroupOf(self.http, calico)
        self.gulp = gulp  # seconds a watch thread sleeps after a read that waited (`WatchStream`)
        self.page_size = page_size
        self.watch_timeout = watch_timeout
        self.read_margin = read_margin
        self.connect_timeout = connect_timeout
        self.list_timeout = list_timeout

    def calico(self) -> CalicoGroup:
        """The API group of Calico's objects (see the class docstring)."""
        return self._calico.group()

    def object_kind(self, kind: Kind) -> tuple[str, str]:
        """(kind, apiVersion) of the objects of `kind`, as the server names them."""
        if kind in CORE_KINDS:
            return CORE_KINDS[kind], "v1"
        if kind in KUBEVIRT_KINDS:
            return KUBEVIRT_KINDS[kind], f"{kv.KUBEVIRT_GROUP}/{kv.KUBEVIRT_VERSION}"
        group = self.calico()
        return group.kind(kind.value), group.api_version

    def path(self, kind: Kind) -> str:
        """The collection of `kind` across namespaces (`/api/v1/pods`, `/apis/<group>/<version>/<plural>`)."""
        if kind is Kind.NODES:
            return "/api/v1/nodes"
        if kind is Kind.PODS:
            return "/api/v1/pods"
        if kind in KUBEVIRT_KINDS:  # namespaced, listed and watched across namespaces
            return f"/apis/{kv.KUBEVIRT_GROUP}/{kv.KUBEVIRT_VERSION}/{kind.value}"
        group = self.calico()
        return f"/apis/{group.name}/{group.version}/{group.plural(kind.value)}"

    def _call(
        self, kind: Kind, verb: str, query: Mapping[str, str], timeout: tuple[float, float]
    ) -> urllib3.BaseHTTPResponse:
        path = self.path(kind)
        try:
            return self.http.stream("GET", path, what=f"{verb} {kind}", query=query, timeout=timeout)
        except ApiError as exc:
            raise translate(exc, f"{verb} {kind}") from exc

    def pages(self, kind: Kind, typed: bool = False) -> Iterator[Page]:
        """A consistent list, page by page (`limit` + `continue`); 410 on an expired continue token.
        `typed`: a page of pods may come as the typed `Pod`s of `slimpods.pod_list_page` (the watcher's
        reflector, which types every item); else items are raw objects or their bytes."""
        token: str | None = None
        while True:
            query = {"limit": str(self.page_size)}
            if token:
                query["continue"] = token
            resp = self._call(kind, "list", query, (self.connect_timeout, self.list_timeout))
            try:
                data = read_body(resp)
                # Pods typed in the scan that frames the page, else framed here and typed item by item.
                fast: tuple[list[Any], str, str | None] | None
                fast = slimpods.pod_list_page(data) if typed and kind is Kind.PODS else None
                if fast is None and kind in FAST_KINDS:
                    fast = slim.list_page(data)
                body = None if fast is not None else orjson.loads(data)
            except (urllib3.exceptions.HTTPError, OSError, orjson.JSONDecodeError) as exc:
                raise translate(exc, f"list {kind}: reading the body") from exc
            finally:
                resp.release_conn()
            del data  # the fast page's items are views of it: it lives exactly as long as they do
            if fast is not None:
                page = Page(list(fast[0]), fast[1], fast[2] is None)
                token = fast[2]
                del fast
                yield page
                del page  # not held while the next page is read (a real-size page is ~7 MB)
                if token is None:
                    return
                continue
            if not isinstance(body, dict) or not isinstance(body.get("items") or [], list):
                raise KubeTransientError(f"list {kind}: the answer is not a list")
            meta = body.get("metadata")
            meta = meta if isinstance(meta, dict) else {}
            token = meta.get("continue") or None
            rv = meta.get("resourceVersion")
            yield Page(body.get("items") or [], rv if isinstance(rv, str) else "", token is None)
            if token is None:
                return

    def items(self, kind: Kind) -> tuple[list[dict[str, Any]], str]:
        """Every object of `kind` (all pages) and the list's resourceVersion."""
        out: list[dict[str, Any]] = []
        rv = ""
        for page in self.pages(kind):
            out.extend(loads_item(i) if isinstance(i, (bytes, msgspec.Raw)) else i for i in page.items)
            rv = page.resource_version
        return out, rv

    def watch(self, kind: Kind, resource_version: str) -> WatchStream:
        """Open a watch from `resource_version`, with bookmarks and a server-side timeout randomised in
        [timeout, 2·timeout) as client-go does; the read timeout is that plus a margin."""
        timeout = int(self.watch_timeout * (1 + random.random()))
        query = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout),
        }
        resp = self._call(kind, "watch", query, (self.connect_timeout, timeout + self.read_margin))
        return WatchStream(kind, resp, gulp=self.gulp, fast=fast_event(kind))


def read_body(resp: urllib3.BaseHTTPResponse) -> bytearray:
    """A list page's whole body, read in `LIST_READ_SIZE` pieces into one buffer.  Reading it at once
    (`resp.data`) held http.client's chunks and their join together: twice the page (~7 MB for 500
    real-size pods) at each page of a cold start."""
    buf = bytearray()
    while piece := resp.read(LIST_READ_SIZE):
        buf += piece
    return buf
