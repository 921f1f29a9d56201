"""A simulated kube-apiserver over real HTTP, for end-to-end tests, demos and benchmarks.

No real API server can run where this project is tested, so this one serves the REST
paths the official ``kubernetes`` client uses (core pods/nodes/namespaces, coordination
leases, Calico's resources in crd.projectcalico.org/v1 or projectcalico.org/v3 (the store's
`resources_for(group)`), discovery) with the semantics of
:mod:`lab.apiserver.store`: chunked JSON watch streams with bookmarks and 410 expiry,
``Status`` errors, optimistic concurrency. It adds what tests need on top: fault
injection (:mod:`lab.apiserver.faults`) and a log of every request (:mod:`lab.apiserver.requestlog`).

This module is the server's lifecycle and test-facing surface (:class:`SimApiServer`); the
HTTP handling lives in :mod:`lab.apiserver.handler`, with routing, discovery and watch
streams in :mod:`lab.apiserver.routing`, :mod:`lab.apiserver.discovery` and
:mod:`lab.apiserver.watchstream`.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path
from typing import Any

import kubernetes.client
import orjson

from lab.apiserver.faults import FaultInjector
from lab.apiserver.handler import SimHTTPServer
from lab.apiserver.requestlog import RequestLog, RequestRecord
from lab.apiserver.resources import JsonObj
from lab.apiserver.serving import OpenWatch
from lab.apiserver.store import Store
from lab.apiserver.watch import Watcher

__all__ = ["RequestLog", "RequestRecord", "SimApiServer"]


# A real kube-apiserver's watch cache sends a bookmark to each watch about once a minute
# (`defaultBookmarkFrequency`); tests that wait on bookmarks pass a shorter interval.
BOOKMARK_SECONDS = 60.0


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
        bookmark_interval: float = BOOKMARK_SECONDS,
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
        self._httpd: SimHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._conn_lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._watches: dict[Watcher, OpenWatch] = {}

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> SimApiServer:
        """Bind and serve in a background thread; returns ``self``."""
        if self._httpd is not None:
            raise RuntimeError("server already started")
        self._stopping.clear()
        self._httpd = SimHTTPServer(self._bind, self)
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
