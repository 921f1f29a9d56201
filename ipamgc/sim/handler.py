"""The HTTP side of the simulated API server: one handler per connection, one method per verb.

:class:`SimRequestHandler` reads a request, resolves it (:mod:`ipamgc.sim.routing`), asks
the fault injector what should go wrong, then calls the :class:`~ipamgc.sim.store.Store`
and writes the answer the way a real API server does: JSON objects with the right status
codes (201 on create, 202 while finalizers hold a delete), ``Status`` objects for errors
and ``Retry-After`` for throttling. Watches are handed to :mod:`ipamgc.sim.watchstream`,
discovery documents come from :mod:`ipamgc.sim.discovery`, ``/_sim/...`` paths (the test
control plane) go to :mod:`ipamgc.sim.control`, and every other request ends up in the
server's request log.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

import orjson

from ipamgc.sim.control import control
from ipamgc.sim.discovery import discovery_document
from ipamgc.sim.faults import FaultDecision
from ipamgc.sim.listing import CONTINUE_EXPIRED
from ipamgc.sim.requestlog import RequestRecord
from ipamgc.sim.resources import ResourceType, SimApiError
from ipamgc.sim.routing import Route, parse_int, resolve, verb_for
from ipamgc.sim.serving import Server
from ipamgc.sim.watchstream import serve_watch

if TYPE_CHECKING:
    from ipamgc.sim.store import Store

__all__ = ["SimHTTPServer", "SimRequestHandler"]

log = logging.getLogger("ipamgc.sim.apiserver")

_PATCH_TYPES = {
    "application/merge-patch+json": "merge",
    "application/strategic-merge-patch+json": "strategic",
    "application/json-patch+json": "json",
}
_NOT_FOUND = "the server could not find the requested resource"


class SimHTTPServer(ThreadingHTTPServer):
    """The listening socket: one thread per connection, each knowing its :class:`SimApiServer`."""

    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], sim: Server) -> None:
        self.sim = sim
        super().__init__(addr, SimRequestHandler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("sim apiserver: connection error from %s", client_address, exc_info=True)


class SimRequestHandler(BaseHTTPRequestHandler):
    """Serves one connection's requests: route, inject faults, call the store, log."""

    protocol_version = "HTTP/1.1"
    server: SimHTTPServer

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
        self._route: Route | None = None
        self._verb = "unknown"
        self._fault: str | None = None
        self._precondition: str | None = None
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
                precondition=self._precondition,
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
        route = resolve(sim.store.registry, parts)
        if route is None:
            raise SimApiError(404, "NotFound", _NOT_FOUND)
        self._route = route
        verb = verb_for(method, route, self._query)
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
            serve_watch(self, sim, route, self._query, decision)
            return
        self._serve(verb, route, body, decision)

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

    def _write_body(self, body: bytes) -> Any:
        """The JSON body of a PUT or PATCH, noting the resourceVersion it is conditional on."""
        obj = self._json_body(body)
        if isinstance(obj, dict):
            self._note_precondition(obj.get("metadata"))
        return obj

    def _note_precondition(self, holder: Any) -> None:
        if isinstance(holder, dict) and holder.get("resourceVersion"):
            self._precondition = str(holder["resourceVersion"])

    def _serve(self, verb: str, route: Route, body: bytes, decision: FaultDecision) -> None:
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
                limit=parse_int(q.get("limit"), "limit"),
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
                self._write_body(body),
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
                self._write_body(body),
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
            self._note_precondition(opts.get("preconditions"))
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

    # -- streaming (used by :mod:`ipamgc.sim.watchstream`) ---------------------------------------

    def begin_chunked(self) -> None:
        """Send the head of a 200 response with a chunked body (a watch stream)."""
        self._record(200)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        self._started = True

    def chunk(self, data: bytes) -> None:
        """Write one HTTP chunk (an empty one ends the body)."""
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def abort(self) -> None:
        """Drop the connection mid-stream, without the terminating chunk."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def client_gone(self) -> bool:
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
        doc = discovery_document(sim, parts)
        if doc is None:
            return False
        self._verb = "discovery"
        decision = sim.faults.decide("discovery", None)
        self._fault = decision.describe()
        if decision.error_code:
            raise SimApiError(
                decision.error_code, decision.error_reason or "InternalError", decision.error_message
            )
        self._send_json(200, doc)
        return True

    def _sim_control(self, method: str, parts: list[str], body: bytes) -> None:
        payload = self._json_body(body, required=False) or {}
        self._send_json(200, control(self.server.sim, method, parts, payload, self._query))


def _exists(store: Store, rt: ResourceType, namespace: str | None, name: str) -> bool:
    try:
        store.get(rt, namespace, name, copy=False)
    except SimApiError:
        return False
    return True
