"""Watch responses of the simulated API server: chunked JSON event streams.

A real API server answers a WATCH with a chunked HTTP body of JSON lines, one per event:
optionally the current state first (as ADDED events, ended by a BOOKMARK for a
watch-list), then every change, periodic BOOKMARKs if the client allows them, an ERROR
event (410 Expired) if the requested version is compacted, and a clean end at
``timeoutSeconds``. This module turns a store :class:`~lab.apiserver.watch.Watcher` into such
a stream and applies the watch faults (``drop_after``, ``drop_rate``: the connection dies
mid-stream, without the terminating chunk).
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import orjson

from lab.apiserver.faults import FaultDecision
from lab.apiserver.resources import JsonObj, ResourceType, SimApiError
from lab.apiserver.routing import Route, parse_bool, parse_int
from lab.apiserver.serving import ChunkedResponse, Server
from lab.apiserver.watch import Watcher

__all__ = ["WatchStream", "event_line", "serve_watch"]

#: Events are batched into HTTP chunks of about this many bytes.
_CHUNK_TARGET = 64 * 1024


def serve_watch(
    handler: ChunkedResponse,
    sim: Server,
    route: Route,
    query: Mapping[str, str],
    decision: FaultDecision,
) -> None:
    """Answer a WATCH request: a 200 chunked stream of events (or a single ERROR event)."""
    q, rt = query, route.rt
    bookmarks = parse_bool(q.get("allowWatchBookmarks"), "allowWatchBookmarks")
    timeout = parse_int(q.get("timeoutSeconds"), "timeoutSeconds")
    if timeout is None:
        timeout = sim.default_watch_timeout
    send_initial = q.get("sendInitialEvents")
    initial_flag = parse_bool(send_initial, "sendInitialEvents") if send_initial else None
    fields = q.get("fieldSelector") or ""
    if route.name is not None:
        fields = ",".join(filter(None, [fields, f"metadata.name={route.name}"]))
    rv = q.get("resourceVersion")
    watcher: Watcher | None = None
    error: SimApiError | None = None
    try:
        if decision.expire:
            error = SimApiError.expired(f"too old resource version: {rv or 0} ({sim.store.resource_version})")
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
    handler.begin_chunked()
    if watcher is None:
        handler.chunk(event_line("ERROR", orjson.dumps(error.status() if error else {})))
        handler.chunk(b"")
        return
    stream = WatchStream(handler, sim, rt, decision, bookmarks)
    with sim._conn_lock:
        sim._watches[watcher] = stream
    try:
        initial = watcher.wants_initial and initial_flag is not False
        if stream.run(watcher, initial=initial, end_bookmark=bool(initial_flag), timeout=timeout):
            handler.chunk(b"")
        else:
            handler.abort()
    finally:
        with sim._conn_lock:
            sim._watches.pop(watcher, None)
        watcher.close()


def event_line(etype: str, raw: bytes) -> bytes:
    """One line of a watch stream: ``{"type": ..., "object": ...}``."""
    return b'{"type":"%s","object":%s}\n' % (etype.encode(), raw)


class WatchStream:
    """Writes one watch's events as chunked JSON lines, with bookmarks and drop faults."""

    def __init__(
        self,
        handler: ChunkedResponse,
        sim: Server,
        rt: ResourceType,
        decision: FaultDecision,
        bookmarks: bool,
    ) -> None:
        self.handler = handler
        self.sim = sim
        self.rt = rt
        self.decision = decision
        self.bookmarks = bookmarks
        self.sent = 0
        self.killed = False
        self.buf: list[bytes] = []
        self.size = 0

    def _flush(self) -> None:
        if self.buf:
            self.handler.chunk(b"".join(self.buf))
            self.buf, self.size = [], 0

    def _emit(self, line: bytes) -> bool:
        """Queue one event; False when a drop fault says the connection dies now."""
        faults, d = self.sim.faults, self.decision
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
        self.buf.append(event_line("BOOKMARK", orjson.dumps(obj)))
        self._flush()

    def run(self, watcher: Watcher, *, initial: bool, end_bookmark: bool, timeout: int | None) -> bool:
        """Stream until timeout, server stop or client disconnect; False means abort."""
        sim = self.sim
        start = time.monotonic()
        deadline = start + timeout if timeout else None
        if initial:
            for objs in watcher.initial_objects():
                for obj in objs:
                    if not self._emit(event_line("ADDED", orjson.dumps(obj))):
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
                self.buf.append(event_line("ERROR", orjson.dumps(exc.status())))
                self._flush()
                return True
            if self.killed:
                return False
            for etype, ev in events:
                if not self._emit(event_line(etype, ev.raw())):
                    return False
            self._flush()
            if not events and self.handler.client_gone():
                return False
            if self.bookmarks and time.monotonic() >= next_bookmark:
                self._bookmark(watcher.cursor)
                next_bookmark = time.monotonic() + sim.bookmark_interval
        return True
