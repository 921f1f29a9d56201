"""In-process watches on the store: the object both the HTTP watch stream and tests consume.

A :class:`Watcher` is opened by :meth:`lab.apiserver.store.Store.watch` at some
resourceVersion. It can first replay the state at that version (what a watch without a
resourceVersion, or a watch-list, starts with) and then reads the events after it from the
store's :class:`~lab.apiserver.history.History`, turning MODIFIED events into ADDED or DELETED
when an object enters or leaves the watch's selectors, as a real API server does. Its
cursor pins the history so events are not trimmed under a slow reader.
"""

from __future__ import annotations

from collections.abc import Iterator

from lab.apiserver.history import Event, History
from lab.apiserver.listing import Snapshot, Table
from lab.apiserver.resources import JsonObj, ResourceType
from lab.apiserver.validation import ObjectFilter

__all__ = ["Watcher"]


class Watcher:
    """One watch: optional initial state, then filtered events read from the history."""

    def __init__(
        self,
        store: object,  # the store that opened it (held, never called: no import of lab.apiserver.store)
        history: History,
        table: Table,
        rt: ResourceType,
        match: ObjectFilter,
        rv: int,
        cid: int,
        *,
        initial: bool,
    ) -> None:
        self.store = store
        self.rt = rt
        self.cursor = rv
        self.wants_initial = initial
        self._history = history
        self._table = table
        self._match = match
        self._cid = cid
        self._cancelled = False

    @property
    def cancelled(self) -> bool:
        """Whether :meth:`cancel` was called."""
        return self._cancelled

    def initial_objects(self, chunk: int = 500) -> Iterator[list[JsonObj]]:
        """The state at the watch's start version, as chunks of matching stored objects."""
        reader = Snapshot(self._history, self._table, self.rt, self.cursor, self._match.namespace)
        for part in reader.chunks(None, size=chunk):
            objs = [obj for _, obj in part if self._match(obj)]
            if objs:
                yield objs

    def poll(self, timeout: float | None) -> list[tuple[str, Event]]:
        """Wait up to ``timeout`` for events after the cursor; 410 if they were trimmed."""
        history = self._history
        with history.cond:
            if history.rv <= self.cursor and not self._cancelled:
                history.cond.wait(timeout)
            if self._cancelled:
                return []
            events = history.since(self.cursor)
            if events:
                self.cursor = events[-1].rv
                history.move_cursor(self._cid, self.cursor)
        out: list[tuple[str, Event]] = []
        plural, match = self.rt.plural, self._match
        for ev in events:
            if ev.rt.plural != plural:
                continue
            if ev.type == "MODIFIED":
                was = ev.old is not None and match(ev.old)
                now = match(ev.obj)
                if was or now:
                    out.append(("MODIFIED" if was and now else "ADDED" if now else "DELETED", ev))
            elif match(ev.obj):
                out.append((ev.type, ev))
        return out

    def cancel(self) -> None:
        """Wake a blocked :meth:`poll` and make further polls return nothing."""
        with self._history.cond:
            self._cancelled = True
            self._history.cond.notify_all()

    def close(self) -> None:
        """Release the watch's hold on the event history."""
        self._cancelled = True
        with self._history.lock:
            self._history.close_cursor(self._cid)

    def __enter__(self) -> Watcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
