"""`RestStore`'s commit hook (`lab.cluster.restapi`): every IPAMBlock change, the actors' own and everybody
else's, told to the hooks in resourceVersion order.

Why a module of its own: the simulated `Store` calls its hooks as it commits; over REST nothing does, so
`RestStore` keeps what the hook needs itself.  That is state of its own, apart from the verbs: the recent
versions of each IPAMBlock (a hook is given the version a write replaced, and the actors' writes are
conditioned on recent ones), the newest version seen of each, the versions the actors' own writes made
(told at once, so skipped when the watch brings them back), and a watch thread that relists as an
informer does after a 410 or a broken stream.  :class:`BlockHook` holds it, and `RestStore` extends it:
its block writes remember, look up and tell under the same lock (``_remember``, ``_version``,
``_own_write``).
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import urllib3

from lab.apiserver.store import SimApiError

__all__ = ["KEEP_VERSIONS", "BlockHook", "CommitHook"]

log = logging.getLogger("lab.cluster.restapi")  # the name these lines had before the module was split

JsonObj = dict[str, Any]
CommitHook = Callable[[str, str, Mapping[str, Any] | None, Mapping[str, Any] | None], None]

#: Versions of one IPAMBlock remembered for the hook (the actors' writes are conditioned on recent ones).
KEEP_VERSIONS = 16


class BlockHook:
    """The IPAMBlocks as the commit hook has seen them, and the watch that keeps them current."""

    if TYPE_CHECKING:  # `RestStore`'s, which extends this: the connection, the paths, the paged list
        server: str
        _headers: dict[str, str]
        _http: urllib3.PoolManager

        def _path(
            self, plural: str, namespace: str | None, name: str | None = None, sub: str | None = None
        ) -> str: ...

        def list(self, resource: str, namespace: str | None = None, **_: Any) -> JsonObj: ...

    def __init__(self) -> None:
        self._hooks: list[CommitHook] = []
        self._lock = threading.RLock()  # own IPAMBlock writes and watch events, one at a time
        self._blocks: dict[str, dict[str, JsonObj]] = {}  # name → resourceVersion → object
        self._latest: dict[str, str] = {}  # name → newest resourceVersion seen ("" once deleted)
        self._own: set[str] = set()  # resourceVersions the actors' own block writes produced
        self._stop = threading.Event()
        self._watch_thread: threading.Thread | None = None
        self._response: Any = None
        self.watch_restarts = 0  # relists after a 410 or a broken stream (the compaction test reads it)

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
        ended = False
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
            ended = True
            return rv
        finally:
            if not ended:
                resp.close()  # a stream cut or given up part-way: its connection is closed here, not reused
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
