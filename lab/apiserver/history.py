"""The store's sense of time: one global resourceVersion and a bounded log of committed writes.

A real API server gets both from etcd: every write gets the next revision, and the history
behind it is kept for a while and then compacted, after which watches and continue tokens
that point into the compacted past get 410 Expired. :class:`History` is that log. Paginated
lists read old states through it and watchers read their events from it, so it also keeps
a cursor per open reader and never trims what an open reader still needs (up to a hard cap).

It owns the lock (and the condition watchers wait on) that guards the whole store: every
method here must be called with :attr:`History.lock` held.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from dataclasses import dataclass

import orjson

from lab.apiserver.resources import JsonObj, Key, ResourceType, SimApiError

__all__ = ["Event", "History"]

#: How far the log may outgrow its window before an ordinary commit trims it.
_TRIM_SLACK = 1024


@dataclass(slots=True)
class Event:
    """One committed write. ``obj`` is the new state (for DELETED the last state at ``rv``)."""

    rv: int
    rt: ResourceType
    type: str
    key: Key
    obj: JsonObj
    old: JsonObj | None
    _raw: bytes | None = None

    def raw(self) -> bytes:
        """``obj`` serialised once and cached for every watcher."""
        if self._raw is None:
            self._raw = orjson.dumps(self.obj)
        return self._raw


class History:
    """The resourceVersion counter, the event log, its compaction point and reader cursors.

    ``window``: how many versions stay readable (older ones are compacted on each commit);
    ``buffer``: how far back the log may be kept for slow open readers (at least ``window``).
    """

    def __init__(self, initial_rv: int, window: int, buffer: int) -> None:
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        self.rv = initial_rv
        self.compacted_rv = initial_rv
        self.window = window
        self.buffer = max(buffer, window)
        self._events: deque[Event] = deque()
        self._cursors: dict[int, int] = {}
        self._cursor_ids = itertools.count(1)

    def next_rv(self) -> int:
        """Advance and return the global resourceVersion (for the write about to commit)."""
        self.rv += 1
        return self.rv

    def append(self, event: Event) -> None:
        """Log a committed write, compact what fell out of the window and wake watchers."""
        self._events.append(event)
        self.compacted_rv = max(self.compacted_rv, self.rv - self.window)
        self.trim()
        self.cond.notify_all()

    def compact(self, rv: int | None = None) -> None:
        """Compact up to ``rv`` (default: everything), like etcd compaction."""
        self.compacted_rv = max(self.compacted_rv, min(self.rv, rv or self.rv))
        self.trim(force=True)

    def trim(self, force: bool = False) -> None:
        """Drop events no open reader needs: compacted ones, or any beyond ``buffer``."""
        events = self._events
        if not events or (not force and len(events) <= self.window + _TRIM_SLACK):
            return
        floor = self.compacted_rv
        if self._cursors:
            floor = min(floor, *self._cursors.values())
        floor = max(floor, self.rv - self.buffer)
        while events and events[0].rv <= floor:
            events.popleft()

    def since(self, rv: int) -> list[Event]:
        """Events after ``rv``, oldest first; 410 Expired if some were already trimmed."""
        events = self._events
        base = events[0].rv - 1 if events else self.rv
        if rv < base:
            raise SimApiError.expired(f"too old resource version: {rv} ({base})")
        return list(itertools.islice(events, rv - base, None)) if rv < self.rv else []

    def open_cursor(self, rv: int) -> int:
        """Pin the log from ``rv`` on for a reader; returns the cursor's id."""
        cid = next(self._cursor_ids)
        self._cursors[cid] = rv
        return cid

    def move_cursor(self, cid: int, rv: int) -> None:
        """The reader has consumed everything up to ``rv``."""
        self._cursors[cid] = rv

    def close_cursor(self, cid: int) -> None:
        """Unpin the log for a reader that is done."""
        self._cursors.pop(cid, None)
