"""What the simulated API server's request handling needs of the server, and the watch stream of its
request handler: narrow interfaces, so that the handler, the control plane, discovery and the watch
stream depend on these and not on `lab.apiserver.apiserver` (which imports them: no import cycle).
"""

from __future__ import annotations

import socket
import threading
from typing import Protocol

from lab.apiserver.faults import FaultInjector
from lab.apiserver.requestlog import RequestLog
from lab.apiserver.resources import JsonObj
from lab.apiserver.store import Store
from lab.apiserver.watch import Watcher


class OpenWatch(Protocol):
    """A watch stream being served, as the server ends it (`drop_watches`)."""

    killed: bool


class Server(Protocol):
    """`lab.apiserver.apiserver.SimApiServer` as its handlers see it."""

    store: Store
    faults: FaultInjector
    request_log: RequestLog
    bookmark_interval: float
    default_watch_timeout: int | None
    _stopping: threading.Event
    _conn_lock: threading.Lock
    _watches: dict[Watcher, OpenWatch]

    @property
    def address(self) -> str: ...

    def version_info(self) -> JsonObj: ...

    def _track(self, conn: socket.socket, *, add: bool) -> None: ...


class ChunkedResponse(Protocol):
    """`lab.apiserver.handler.SimRequestHandler` as a watch stream writes to it."""

    def begin_chunked(self) -> None: ...

    def chunk(self, data: bytes) -> None: ...

    def abort(self) -> None: ...

    def client_gone(self) -> bool: ...
