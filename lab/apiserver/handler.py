"""The HTTP side of the simulated API server: one handler per connection, routing every request.

:class:`SimRequestHandler` reads a request, resolves it (:mod:`lab.apiserver.routing`), asks
the fault injector what should go wrong, hands it on and writes the answer the way a real
API server does: ``Status`` objects for errors and ``Retry-After`` for throttling.  What
each object verb does with the :class:`~lab.apiserver.store.Store` and answers (201 on create,
the object while a delete is pending) is :mod:`lab.apiserver.verbs`; watches are handed to
:mod:`lab.apiserver.watchstream`, discovery documents come from :mod:`lab.apiserver.discovery`,
``/_sim/...`` paths (the test control plane) go to :mod:`lab.apiserver.control`, and every
other request ends up in the server's request log.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson

from lab.apiserver.control import control
from lab.apiserver.discovery import discovery_document
from lab.apiserver.requestlog import RequestRecord
from lab.apiserver.resources import SimApiError
from lab.apiserver.routing import Route, resolve, verb_for
from lab.apiserver.serving import Server
from lab.apiserver.verbs import json_body, serve_object
from lab.apiserver.watchstream import serve_watch

__all__ = ["SimHTTPServer", "SimRequestHandler"]

log = logging.getLogger("lab.apiserver.apiserver")

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
    """Serves one connection's requests: route, inject faults, hand on to the verb, log."""

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
            if not self._group_version_served(parts):
                # A real kube-apiserver answers a path outside every served group/version from its mux, in
                # plain text (the realapi tier, docs/real-apiserver.md); inside one, a JSON Status.
                self._send(404, b"404 page not found\n", "text/plain; charset=utf-8")
                return
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
        serve_object(self, sim.store, verb, route, self._query, body, decision)

    def _group_version_served(self, parts: list[str]) -> bool:
        """Whether `parts` lies under a group/version this server serves (`/api/v1/...`, `/apis/g/v/...`)."""
        served = self.server.sim.store.registry.group_versions()
        if len(parts) >= 2 and parts[0] == "api":
            return ("", parts[1]) in served
        return len(parts) >= 3 and parts[0] == "apis" and (parts[1], parts[2]) in served

    # -- object verbs (answered by :mod:`lab.apiserver.verbs`) ------------------------------------------

    def _note_precondition(self, holder: Any) -> None:
        if isinstance(holder, dict) and holder.get("resourceVersion"):
            self._precondition = str(holder["resourceVersion"])

    # -- streaming (used by :mod:`lab.apiserver.watchstream`) ---------------------------------------

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
        payload = json_body(body, required=False) or {}
        self._send_json(200, control(self.server.sim, method, parts, payload, self._query))
