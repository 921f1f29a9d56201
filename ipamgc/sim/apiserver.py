"""A simulated kube-apiserver over real HTTP, for end-to-end tests, demos and benchmarks.

No real API server can run where this project is tested, so this one serves the REST
paths the official ``kubernetes`` client uses (core pods/nodes/namespaces, coordination
leases, Calico's crd.projectcalico.org resources, discovery) with the semantics of
:mod:`ipamgc.sim.store`: chunked JSON watch streams with bookmarks and 410 expiry,
``Status`` errors, optimistic concurrency. It adds what tests need on top: fault
injection (:mod:`ipamgc.sim.faults`) and a log of every request.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import kubernetes.client
import orjson

from ipamgc.sim.faults import FaultDecision, FaultInjector
from ipamgc.sim.store import CONTINUE_EXPIRED, JsonObj, ResourceType, SimApiError, Store, Watcher

__all__ = ["RequestLog", "RequestRecord", "SimApiServer"]

log = logging.getLogger(__name__)

_PATCH_TYPES = {
    "application/merge-patch+json": "merge",
    "application/strategic-merge-patch+json": "strategic",
    "application/json-patch+json": "json",
}
_VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]
_NOT_FOUND = "the server could not find the requested resource"
_CHUNK_TARGET = 64 * 1024


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One served request. ``verb`` is the Kubernetes verb (or "discovery"/"health")."""

    timestamp: float
    method: str
    path: str
    query: dict[str, str]
    status: int
    verb: str
    resource: str | None
    name: str | None
    namespace: str | None
    subresource: str | None
    user_agent: str
    client: str
    duration: float
    fault: str | None


class RequestLog:
    """A bounded, thread-safe log of :class:`RequestRecord`."""

    def __init__(self, maxlen: int = 100_000) -> None:
        self._lock = threading.Lock()
        self._records: deque[RequestRecord] = deque(maxlen=maxlen)

    def append(self, record: RequestRecord) -> None:
        """Record one request."""
        with self._lock:
            self._records.append(record)

    def records(self) -> list[RequestRecord]:
        """All retained records, oldest first."""
        with self._lock:
            return list(self._records)

    def clear(self) -> None:
        """Forget every record."""
        with self._lock:
            self._records.clear()

    def find(self, **criteria: Any) -> list[RequestRecord]:
        """Records whose fields equal every given criterion; ``since`` filters on timestamp.

        Example: ``find(method="PUT", resource="ipamblocks", user_agent="stale-leader")``.
        """
        since = criteria.pop("since", None)
        bad = set(criteria) - set(RequestRecord.__dataclass_fields__)
        if bad:
            raise TypeError(f"unknown request fields: {sorted(bad)}")
        return [
            r
            for r in self.records()
            if (since is None or r.timestamp >= since)
            and all(getattr(r, k) == v for k, v in criteria.items())
        ]


@dataclass(frozen=True, slots=True)
class _Route:
    rt: ResourceType
    namespace: str | None
    name: str | None
    subresource: str | None
    watch_path: bool


def _parse_bool(value: str | None, param: str) -> bool:
    if value is None or value == "":
        return False
    if value in ("1", "t", "T", "true", "TRUE", "True"):
        return True
    if value in ("0", "f", "F", "false", "FALSE", "False"):
        return False
    raise SimApiError.bad_request(f'invalid value for {param}: "{value}"')


def _parse_int(value: str | None, param: str) -> int | None:
    if value in (None, ""):
        return None
    try:
        return int(str(value))
    except ValueError:
        raise SimApiError.bad_request(f'invalid value for {param}: "{value}"') from None


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], sim: SimApiServer) -> None:
        self.sim = sim
        super().__init__(addr, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("sim apiserver: connection error from %s", client_address, exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HTTPServer

    # -- plumbing --------------------------------------------------------------------------------

    def setup(self) -> None:
        super().setup()
        # headers and body go out in separate writes: without this, Nagle + delayed ACK cost 40 ms
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.sim._track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        except OSError:
            pass
        finally:
            self.server.sim._track(self.connection, add=False)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("sim apiserver: " + format, *args)

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def _handle(self, method: str) -> None:
        self._t0 = time.monotonic()
        self._started = False
        self._recorded = False
        self._control = False
        self._route: _Route | None = None
        self._verb = "unknown"
        self._fault: str | None = None
        url = urlsplit(self.path)
        self._path = url.path
        self._query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        try:
            body = self._read_body()
            self._dispatch(method, body)
        except SimApiError as exc:
            self._send_error(exc)
        except ConnectionError:
            self.close_connection = True
        except Exception:
            log.exception("sim apiserver: internal error serving %s %s", method, self.path)
            if self._started:
                self.close_connection = True
            else:
                self._send_error(SimApiError(500, "InternalError", "Internal error occurred"))

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            parts: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _record(self, status: int) -> None:
        if self._recorded or self._control:
            return
        self._recorded = True
        route = self._route
        self.server.sim.request_log.append(
            RequestRecord(
                timestamp=time.time(),
                method=self.command,
                path=self._path,
                query=dict(self._query),
                status=status,
                verb=self._verb,
                resource=route.rt.plural if route else None,
                name=route.name if route else None,
                namespace=route.namespace if route else None,
                subresource=route.subresource if route else None,
                user_agent=self.headers.get("User-Agent", ""),
                client=f"{self.client_address[0]}:{self.client_address[1]}",
                duration=time.monotonic() - self._t0,
                fault=self._fault,
            )
        )

    def _send(
        self,
        status: int,
        body: bytes,
        ctype: str = "application/json",
        extra: Mapping[str, str] | None = None,
    ) -> None:
        self._record(status)
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-cache, private")
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self._started = True
        self.wfile.write(body)

    def _send_json(self, status: int, obj: Any) -> None:
        self._send(status, orjson.dumps(obj))

    def _send_error(self, exc: SimApiError) -> None:
        extra = {}
        if exc.retry_after is not None:
            extra["Retry-After"] = str(max(0, int(exc.retry_after + 0.999)))
        self._send(exc.code, orjson.dumps(exc.status()), extra=extra)

    # -- routing ---------------------------------------------------------------------------------

    def _dispatch(self, method: str, body: bytes) -> None:
        sim = self.server.sim
        parts = [p for p in self._path.split("/") if p]
        if parts and parts[0] == "_sim":
            self._control = True
            self._sim_control(method, parts[1:], body)
            return
        if method == "GET" and self._discovery(parts):
            return
        route = self._resolve(parts)
        if route is None:
            raise SimApiError(404, "NotFound", _NOT_FOUND)
        self._route = route
        verb = self._verb_for(method, route)
        self._verb = verb
        decision = sim.faults.decide(
            verb,
            route.rt.plural,
            route.name,
            route.namespace,
            continuing=bool(self._query.get("continue")),
        )
        self._fault = decision.describe()
        if decision.latency and sim._stopping.wait(decision.latency):
            raise SimApiError(503, "ServiceUnavailable", "the server is shutting down")
        if decision.error_code:
            raise SimApiError(
                decision.error_code,
                decision.error_reason or "InternalError",
                decision.error_message,
                details={"retryAfterSeconds": int(decision.retry_after_header or 0)}
                if decision.retry_after is not None
                else None,
                retry_after=decision.retry_after,
            )
        if verb == "watch":
            self._watch(route, decision)
            return
        self._serve(verb, route, body, decision)

    def _resolve(self, parts: list[str]) -> _Route | None:
        if len(parts) >= 2 and parts[0] == "api":
            group, version, rest = "", parts[1], parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            return None
        watch_path = bool(rest) and rest[0] == "watch"
        if watch_path:
            rest = rest[1:]
        lookup = self.server.sim.store.registry.lookup
        namespace: str | None = None
        nested = lookup(group, version, rest[2]) if len(rest) >= 3 and rest[0] == "namespaces" else None
        if nested is not None and nested.namespaced:
            rt, namespace, tail = nested, rest[1], rest[3:]
        elif rest and (top := lookup(group, version, rest[0])) is not None:
            rt, tail = top, rest[1:]
            if rt.namespaced and tail:
                return None
        else:
            return None
        if len(tail) > 2 or (len(tail) == 2 and tail[1] not in rt.subresources):
            return None
        name = tail[0] if tail else None
        return _Route(rt, namespace, name, tail[1] if len(tail) == 2 else None, watch_path)

    def _verb_for(self, method: str, route: _Route) -> str:
        named = route.name is not None
        watch = route.watch_path or _parse_bool(self._query.get("watch"), "watch")
        verb = {
            "GET": "watch" if watch else "get" if named else "list",
            "POST": None if named else "create",
            "PUT": "update" if named else None,
            "PATCH": "patch" if named else None,
            "DELETE": "delete" if named else None,
        }.get(method)
        if verb is None or (route.subresource and verb not in ("get", "update", "patch")):
            raise SimApiError(
                405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
            )
        if verb == "create" and route.rt.namespaced and route.namespace is None:
            raise SimApiError(
                405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
            )
        return verb

    # -- object verbs ----------------------------------------------------------------------------

    def _json_body(self, body: bytes, *, required: bool = True) -> Any:
        if not body.strip():
            if required:
                raise SimApiError.bad_request("the request body is empty")
            return None
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise SimApiError.bad_request(f"couldn't get version/kind; json parse error: {exc}") from None

    def _serve(self, verb: str, route: _Route, body: bytes, decision: FaultDecision) -> None:
        store, q, rt = self.server.sim.store, self._query, route.rt
        dry_run = q.get("dryRun") == "All"
        if verb == "get":
            self._send_json(200, store.get(rt, route.namespace, route.name or "", copy=False))
        elif verb == "list":
            if decision.expire and q.get("continue"):
                raise SimApiError.expired(CONTINUE_EXPIRED)
            result = store.list(
                rt,
                route.namespace,
                label_selector=q.get("labelSelector"),
                field_selector=q.get("fieldSelector"),
                limit=_parse_int(q.get("limit"), "limit"),
                continue_token=q.get("continue"),
                resource_version=q.get("resourceVersion"),
                resource_version_match=q.get("resourceVersionMatch"),
                copy=False,
            )
            self._send_json(200, result)
        elif verb == "create":
            obj = store.create(rt, route.namespace, self._json_body(body), dry_run=dry_run, copy=False)
            self._send_json(201, obj)
        elif verb == "update":
            name = route.name or ""
            existed = route.subresource is not None or _exists(store, rt, route.namespace, name)
            obj = store.replace(
                rt,
                route.namespace,
                name,
                self._json_body(body),
                subresource=route.subresource,
                dry_run=dry_run,
                copy=False,
            )
            self._send_json(200 if existed else 201, obj)
        elif verb == "patch":
            ctype = self.headers.get("Content-Type", "").split(";")[0].strip().lower()
            patch_type = _PATCH_TYPES.get(ctype)
            if patch_type is None:
                accepted = ", ".join(_PATCH_TYPES)
                raise SimApiError(
                    415,
                    "UnsupportedMediaType",
                    "the body of the request was in an unknown format - accepted media types "
                    f"include: {accepted}",
                )
            obj = store.patch(
                rt,
                route.namespace,
                route.name or "",
                self._json_body(body),
                patch_type=patch_type,
                subresource=route.subresource,
                dry_run=dry_run,
                copy=False,
            )
            self._send_json(200, obj)
        else:
            opts = self._json_body(body, required=False) or {}
            if not isinstance(opts, dict):
                raise SimApiError.bad_request("DeleteOptions must be a JSON object")
            dry_run = dry_run or "All" in (opts.get("dryRun") or [])
            obj = store.delete(
                rt,
                route.namespace,
                route.name or "",
                preconditions=opts.get("preconditions"),
                dry_run=dry_run,
                copy=False,
            )
            meta = obj.get("metadata") or {}
            if meta.get("deletionTimestamp") and meta.get("finalizers"):
                self._send_json(202, obj)  # not gone yet: finalizers pending
            elif rt.returns_deleted:
                self._send_json(200, obj)
            else:
                details = {"name": meta.get("name"), "kind": rt.plural, "uid": meta.get("uid")}
                if rt.group:
                    details["group"] = rt.group
                success = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}
                self._send_json(200, success | {"details": details})

    # -- watch -----------------------------------------------------------------------------------

    def _watch(self, route: _Route, decision: FaultDecision) -> None:
        sim, q, rt = self.server.sim, self._query, route.rt
        bookmarks = _parse_bool(q.get("allowWatchBookmarks"), "allowWatchBookmarks")
        timeout = _parse_int(q.get("timeoutSeconds"), "timeoutSeconds")
        if timeout is None:
            timeout = sim.default_watch_timeout
        send_initial = q.get("sendInitialEvents")
        initial_flag = _parse_bool(send_initial, "sendInitialEvents") if send_initial else None
        fields = q.get("fieldSelector") or ""
        if route.name is not None:
            fields = ",".join(filter(None, [fields, f"metadata.name={route.name}"]))
        rv = q.get("resourceVersion")
        watcher: Watcher | None = None
        error: SimApiError | None = None
        try:
            if decision.expire:
                error = SimApiError.expired(
                    f"too old resource version: {rv or 0} ({sim.store.resource_version})"
                )
            else:
                watcher = sim.store.watch(
                    rt,
                    route.namespace,
                    label_selector=q.get("labelSelector"),
                    field_selector=fields,
                    resource_version=None if initial_flag else rv,
                )
        except SimApiError as exc:
            if exc.code != 410:
                raise
            error = exc
        self._record(200)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        self._started = True
        if watcher is None:
            self._chunk(_event_line("ERROR", orjson.dumps(error.status() if error else {})))
            self._chunk(b"")
            return
        stream = _WatchStream(self, rt, decision, bookmarks)
        with sim._conn_lock:
            sim._watches[watcher] = stream
        try:
            initial = watcher.wants_initial and initial_flag is not False
            if stream.run(watcher, initial=initial, end_bookmark=bool(initial_flag), timeout=timeout):
                self._chunk(b"")
            else:
                self._abort()
        finally:
            with sim._conn_lock:
                sim._watches.pop(watcher, None)
            watcher.close()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _abort(self) -> None:
        """Drop the connection mid-stream, without the terminating chunk."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def _client_gone(self) -> bool:
        """Whether the watching client hung up (an orderly EOF or a reset)."""
        try:
            return not self.connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        except OSError:
            return True

    # -- discovery and control -------------------------------------------------------------------

    def _discovery(self, parts: list[str]) -> bool:
        sim = self.server.sim
        if parts in (["healthz"], ["readyz"], ["livez"]):
            self._verb = "health"
            self._send(200, b"ok", "text/plain; charset=utf-8")
            return True
        doc: JsonObj | None = None
        if parts == ["version"]:
            doc = sim.version_info()
        elif parts == ["api"]:
            doc = {
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": sim.address}],
            }
        elif parts == ["apis"]:
            groups = [
                _api_group(sim.store, g)
                for g in dict.fromkeys(g for g, _ in sim.store.registry.group_versions())
                if g
            ]
            doc = {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
        elif len(parts) == 2 and parts[0] == "apis" and _api_group(sim.store, parts[1])["versions"]:
            doc = _api_group(sim.store, parts[1]) | {"kind": "APIGroup", "apiVersion": "v1"}
        elif (len(parts) == 2 and parts[0] == "api") or (len(parts) == 3 and parts[0] == "apis"):
            group, version = ("", parts[1]) if parts[0] == "api" else (parts[1], parts[2])
            doc = _resource_list(sim.store, group, version)
        if doc is None:
            return False
        self._verb = "discovery"
        self._send_json(200, doc)
        return True

    def _sim_control(self, method: str, parts: list[str], body: bytes) -> None:
        sim = self.server.sim
        payload = self._json_body(body, required=False) or {}
        if parts == ["faults"] and method in ("GET", "POST", "DELETE"):
            if method == "DELETE":
                payload = {"action": "clear"}
            try:
                result = sim.faults.control(payload if method != "GET" else {"action": "list"})
            except (ValueError, TypeError, KeyError) as exc:
                raise SimApiError.bad_request(f"invalid fault request: {exc}") from None
            self._send_json(200, result)
        elif parts == ["requests"] and method == "GET":
            criteria: dict[str, Any] = {
                k: v for k, v in self._query.items() if k in RequestRecord.__dataclass_fields__
            }
            if "status" in criteria:
                criteria["status"] = int(criteria["status"])
            self._send_json(200, {"items": [asdict(r) for r in sim.request_log.find(**criteria)]})
        elif parts == ["requests"] and method == "DELETE":
            sim.request_log.clear()
            self._send_json(200, {"items": []})
        elif parts == ["compact"] and method == "POST":
            sim.store.compact()
            self._send_json(200, {"compactedResourceVersion": str(sim.store.compacted_rv)})
        else:
            raise SimApiError(404, "NotFound", _NOT_FOUND)


def _exists(store: Store, rt: ResourceType, namespace: str | None, name: str) -> bool:
    try:
        store.get(rt, namespace, name, copy=False)
    except SimApiError:
        return False
    return True


def _event_line(etype: str, raw: bytes) -> bytes:
    return b'{"type":"%s","object":%s}\n' % (etype.encode(), raw)


class _WatchStream:
    """Writes one watch's events as chunked JSON lines, with bookmarks and drop faults."""

    def __init__(self, handler: _Handler, rt: ResourceType, decision: FaultDecision, bookmarks: bool) -> None:
        self.handler = handler
        self.rt = rt
        self.decision = decision
        self.bookmarks = bookmarks
        self.sent = 0
        self.killed = False
        self.buf: list[bytes] = []
        self.size = 0

    def _flush(self) -> None:
        if self.buf:
            self.handler._chunk(b"".join(self.buf))
            self.buf, self.size = [], 0

    def _emit(self, line: bytes) -> bool:
        """Queue one event; False when a drop fault says the connection dies now."""
        faults, d = self.handler.server.sim.faults, self.decision
        if (d.drop_after is not None and self.sent >= d.drop_after) or faults.roll(d.drop_rate):
            self._flush()
            return False
        self.buf.append(line)
        self.size += len(line)
        self.sent += 1
        if self.size >= _CHUNK_TARGET:
            self._flush()
        return True

    def _bookmark(self, rv: int, end_of_initial: bool = False) -> None:
        meta: JsonObj = {"resourceVersion": str(rv)}
        if end_of_initial:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        obj = {"kind": self.rt.kind, "apiVersion": self.rt.api_version, "metadata": meta}
        self.buf.append(_event_line("BOOKMARK", orjson.dumps(obj)))
        self._flush()

    def run(self, watcher: Watcher, *, initial: bool, end_bookmark: bool, timeout: int | None) -> bool:
        """Stream until timeout, server stop or client disconnect; False means abort."""
        sim = self.handler.server.sim
        start = time.monotonic()
        deadline = start + timeout if timeout else None
        if initial:
            for objs in watcher.initial_objects():
                for obj in objs:
                    if not self._emit(_event_line("ADDED", orjson.dumps(obj))):
                        return False
            self._flush()
        if end_bookmark and self.bookmarks:
            self._bookmark(watcher.cursor, end_of_initial=True)
        if self.decision.drop_after == 0:
            self._flush()
            return False
        next_bookmark = time.monotonic() + sim.bookmark_interval
        while not sim._stopping.is_set():
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                if self.bookmarks:
                    self._bookmark(watcher.cursor)
                return True
            wait = 1.0
            if deadline is not None:
                wait = min(wait, deadline - now)
            if self.bookmarks:
                wait = min(wait, max(0.0, next_bookmark - now))
            try:
                events = watcher.poll(wait)
            except SimApiError as exc:
                self._flush()
                self.buf.append(_event_line("ERROR", orjson.dumps(exc.status())))
                self._flush()
                return True
            if self.killed:
                return False
            for etype, ev in events:
                if not self._emit(_event_line(etype, ev.raw())):
                    return False
            self._flush()
            if not events and self.handler._client_gone():
                return False
            if self.bookmarks and time.monotonic() >= next_bookmark:
                self._bookmark(watcher.cursor)
                next_bookmark = time.monotonic() + sim.bookmark_interval
        return True


def _api_group(store: Store, group: str) -> JsonObj:
    versions = [
        {"groupVersion": f"{g}/{v}", "version": v} for g, v in store.registry.group_versions() if g == group
    ]
    return {"name": group, "versions": versions, "preferredVersion": versions[0] if versions else {}}


def _resource_list(store: Store, group: str, version: str) -> JsonObj | None:
    rts = store.registry.in_group_version(group, version)
    if not rts:
        return None
    resources: list[JsonObj] = []
    for rt in rts:
        digest = hashlib.sha256(f"{rt.api_version}/{rt.kind}".encode()).digest()[:8]
        entry: JsonObj = {
            "name": rt.plural,
            "singularName": rt.kind.lower(),
            "namespaced": rt.namespaced,
            "kind": rt.kind,
            "verbs": _VERBS,
            "storageVersionHash": base64.b64encode(digest).decode(),
        }
        if rt.short_names:
            entry["shortNames"] = list(rt.short_names)
        resources.append(entry)
        for sub in rt.subresources:
            resources.append(
                {
                    "name": f"{rt.plural}/{sub}",
                    "singularName": "",
                    "namespaced": rt.namespaced,
                    "kind": rt.kind,
                    "verbs": ["get", "patch", "update"],
                }
            )
    group_version = f"{group}/{version}" if group else version
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    }


class SimApiServer:
    """A simulated Kubernetes API server on a loopback port.

    ``with SimApiServer() as server:`` starts it; ``server.store`` gives in-process access
    to the same objects; ``server.faults`` injects failures; ``server.requests`` lists what
    clients asked for.
    """

    def __init__(
        self,
        store: Store | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        history_window: int = 10_000,
        bookmark_interval: float = 1.0,
        default_watch_timeout: int | None = None,
        fault_seed: int | None = 0,
        request_log_size: int = 100_000,
        version: tuple[int, int] = (1, 31),
    ) -> None:
        self.store = store if store is not None else Store(history_window=history_window)
        self.faults = FaultInjector(fault_seed)
        self.request_log = RequestLog(request_log_size)
        self.bookmark_interval = bookmark_interval
        self.default_watch_timeout = default_watch_timeout
        self._bind = (host, port)
        self._version = version
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._conn_lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._watches: dict[Watcher, _WatchStream] = {}

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> SimApiServer:
        """Bind and serve in a background thread; returns ``self``."""
        if self._httpd is not None:
            raise RuntimeError("server already started")
        self._stopping.clear()
        self._httpd = _HTTPServer(self._bind, self)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="sim-apiserver",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving: end watches, close client connections and the listening socket."""
        httpd, thread = self._httpd, self._thread
        if httpd is None:
            return
        self._stopping.set()
        httpd.shutdown()
        with self._conn_lock:
            watchers = list(self._watches)
        for watcher in watchers:
            watcher.cancel()
        with self._conn_lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if thread is not None:
            thread.join(timeout)
        httpd.server_close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._conn_lock:
                if not self._conns:
                    break
            self._stopping.wait(0.01)
        self._httpd = self._thread = None

    def __enter__(self) -> SimApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _track(self, conn: socket.socket, *, add: bool) -> None:
        with self._conn_lock:
            if add:
                self._conns.add(conn)
            else:
                self._conns.discard(conn)

    # -- addresses and clients --------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The bound port (after :meth:`start`)."""
        if self._httpd is None:
            raise RuntimeError("server not started")
        return int(self._httpd.server_address[1])

    @property
    def address(self) -> str:
        """``host:port``."""
        return f"{self._bind[0]}:{self.port}"

    @property
    def url(self) -> str:
        """``http://host:port``."""
        return f"http://{self.address}"

    def client_configuration(self) -> kubernetes.client.Configuration:
        """A client configuration pointing at this server (plain HTTP, no auth)."""
        cfg = kubernetes.client.Configuration()
        cfg.host = self.url
        return cfg

    def api_client(self) -> kubernetes.client.ApiClient:
        """A new ``ApiClient`` for this server; close it (or use it as a context manager)."""
        return kubernetes.client.ApiClient(self.client_configuration())

    def write_kubeconfig(self, path: str | Path, *, namespace: str = "default") -> Path:
        """Write a kubeconfig (JSON, which is valid YAML) whose current context is this server."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "sim", "cluster": {"server": self.url}}],
            "users": [{"name": "sim", "user": {}}],
            "contexts": [
                {"name": "sim", "context": {"cluster": "sim", "user": "sim", "namespace": namespace}}
            ],
            "current-context": "sim",
        }
        out = Path(path)
        out.write_bytes(orjson.dumps(config, option=orjson.OPT_INDENT_2))
        return out

    def version_info(self) -> JsonObj:
        """The ``/version`` document."""
        major, minor = self._version
        return {
            "major": str(major),
            "minor": str(minor),
            "gitVersion": f"v{major}.{minor}.0-ipamgc-sim",
            "gitCommit": "0" * 40,
            "gitTreeState": "clean",
            "buildDate": "2024-08-13T07:28:49Z",
            "goVersion": "go1.22.5",
            "compiler": "gc",
            "platform": "linux/amd64",
        }

    # -- test helpers ------------------------------------------------------------------------------

    @property
    def requests(self) -> list[RequestRecord]:
        """Every logged request (control endpoints excluded), oldest first."""
        return self.request_log.records()

    def find_requests(self, **criteria: Any) -> list[RequestRecord]:
        """Logged requests matching every criterion, e.g. ``method="PUT", resource="ipamblocks"``."""
        return self.request_log.find(**criteria)

    def clear_requests(self) -> None:
        """Forget the request log."""
        self.request_log.clear()

    def compact(self) -> None:
        """Compact the store's history: older watches and continue tokens get 410."""
        self.store.compact()

    def drop_watches(self, resource: str | None = None) -> int:
        """Abruptly close open watch streams (of one resource, or all); returns how many.

        Together with :meth:`compact` this mimics an API server restart, after which
        clients must re-watch and, if their version is gone, re-list.
        """
        dropped = 0
        with self._conn_lock:
            streams = list(self._watches.items())
        for watcher, stream in streams:
            if resource is None or watcher.rt.plural == resource:
                stream.killed = True
                watcher.cancel()
                dropped += 1
        return dropped

    @property
    def open_watches(self) -> int:
        """How many watch streams are being served right now."""
        with self._conn_lock:
            return len(self._watches)
