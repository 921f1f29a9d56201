"""The hand-off between the watcher's reflector threads and its publisher: one bounded queue.

Why a module: it is the watcher's only point of contention between threads, and the part of it most
tuned for CPU.  The reflectors (one per watched kind, and KubeVirt's) call `put` once per watch event or
list page; the publisher calls `take` once per batch.  `put` blocks while `queue_size` items (or list
objects, by weight) are pending: back-pressure when the publisher falls behind, so that a cold start
holds a bounded number of typed objects however much faster the lists are read than mirrored.  `take`
sleeps through the batch window in one wait (Calico's ProcessBatch), woken early only when the batch is
full or a list page arrives, never once per event.
"""

from __future__ import annotations

import collections
import threading
import time

from producer.kinds import Kind
from producer.kubevirt import KubeVirtServed
from producer.reflector import Item, Listed, ListPage
from shared.config import Settings

# What a pending list object weighs against `queue_size`: an IPAMBlock as 8, anything else 1.  A /26 block
# is ~13 KB of JSON (64 attributes), a pod 0.4–6 KB; a pending page's objects are typed but not yet
# mirrored.  With `queue_size` 10,000: ~1,250 blocks (two or three pages of ~4 MB) pending at most, against
# 10,000 (twenty) when a block counted as one; at 10k pods every block fits in, as before.
BLOCK_WEIGHT = 8


def _weight(page: ListPage) -> int:
    return len(page.objects) * (BLOCK_WEIGHT if page.kind is Kind.BLOCKS else 1)


class Handoff:
    """The reflectors' sink (`put`) and the publisher's source (`take`); `wake` ends a `take`'s window
    (the watcher calls it when it stops).  `stop` is the watcher's: `put` gives up once it is set."""

    def __init__(self, settings: Settings, stop: threading.Event) -> None:
        self.settings = settings
        self._stop = stop
        # A deque (append and popleft are atomic) and an event set only for the first item of a batch, so
        # the publisher is not woken once per watch event (the condition variable of a queue.Queue was a
        # tenth of the watcher's CPU).
        self._items: collections.deque[Item | KubeVirtServed] = collections.deque()
        self._has_items = threading.Event()
        # Set by `put` once a batch is full, the list pages pending reach `queue_size`, or a list page or a
        # list's end arrives, and by `wake`; cleared by `take` as it takes: the publisher sleeps through a
        # batch window in one wait.  (Looking every 50 ms was 20 wake-ups a
        # second whenever anything at all was changing: a fifth of the watcher's CPU at 5 pod events/s.)
        self._full = threading.Event()
        # Objects of list pages handed off and not yet taken: a cold start holds a bounded number of
        # typed objects (`queue_size`), however much faster the lists are read than mirrored.
        self._paged = 0
        # Guards `_paged`; notified by `take` whenever it has taken items, so that a reflector waiting for
        # room goes on at once (it used to look every 50 ms: a page behind a pending one waited that long).
        self._room = threading.Condition(threading.Lock())

    @property
    def paged(self) -> int:
        """Objects of list pages handed off and not yet taken (by weight)."""
        return self._paged

    def nudge(self) -> None:
        """End the publisher's wait now, items or not (a stop, or its next kick moved earlier): `take`
        returns what it has, maybe nothing."""
        self._full.set()
        self._has_items.set()

    def put(self, item: Item | KubeVirtServed) -> None:
        """The reflectors' sink: waits while `queue_size` items are pending (back-pressure), gives up
        when stopping."""
        limit = self.settings.queue_size
        weight = _weight(item) if isinstance(item, ListPage) else 0
        with self._room:
            while len(self._items) >= limit or (weight and self._paged >= limit):
                if self._stop.is_set():
                    return
                self._room.wait(0.05)  # woken by `take`; the timeout only to notice a stop
            self._paged += weight
        self._items.append(item)
        if not self._has_items.is_set():
            self._has_items.set()
        # A list's pages and its end are taken at once, not after the batch window: a cold start (or a
        # relist) is mirrored as it arrives and declared synced when its last list ends, not up to one
        # window later (at 10k pods the window was half of the time to the sync).
        if (
            isinstance(item, ListPage | Listed)
            or len(self._items) >= self.settings.batch_size
            or self._paged >= limit
        ):
            self._full.set()

    def take(self, timeout: float) -> list[Item | KubeVirtServed]:
        """Up to `batch_size` items, waiting at most `batch_wait_seconds` after the first (Calico's
        ProcessBatch).  The window is slept through in one wait, ended early by `put` when the batch is
        full (never woken per item)."""
        if not self._items and not self._has_items.wait(timeout):
            return []
        limit = self.settings.batch_size
        deadline = time.monotonic() + self.settings.batch_wait_seconds
        full = self.settings.queue_size
        while len(self._items) < limit and self._paged < full and (left := deadline - time.monotonic()) > 0:
            if self._stop.is_set() or self._full.wait(left):  # set since the last take: take now
                break
        # Cleared before the items are taken: a `put` from here on sets it again for the next take.
        self._full.clear()
        self._has_items.clear()
        items: list[Item | KubeVirtServed] = []
        taken = 0
        while self._items and len(items) < limit:
            item = self._items.popleft()
            items.append(item)
            if isinstance(item, ListPage):
                taken += _weight(item)  # as `put` counted it
        if items:
            with self._room:
                self._paged -= taken
                self._room.notify_all()
        if self._items:
            self._has_items.set()
        return items
