"""The watcher's periodic backstop: its timer, and the full resync when that is the backstop chosen.

Why a module: it is a thread and a timer of its own, apart from the publisher's batches.  Calico resyncs
every leak grace period / 2 (else 5 minutes; `Settings.resync_period`), so the period follows the grace
period the publisher last configured: a change wakes this thread, which computes the period again.  When
a period ends, the backstop (`producer/backstop.py`, the default) is handed to the publisher thread, which
owns the watcher's memory it reads (`take`, then `ask` ends the publisher's wait); the full resync
(`--backstop full`) runs here, marking every allocation dirty in chunks with a pause between them
(`Mirror.mark_all_dirty`), so that it does not starve the workers; stopping the watcher aborts it between
chunks.  It starts once the mirror is synced (nothing is decided before).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import redis

from producer.mirror import Mirror
from producer.reflector import WatchStats
from shared.config import Settings

log = logging.getLogger(__name__)


class _Stopping(Exception):
    """Raised from the resync's pause to abort it when the watcher stops."""


class Resync:
    """`run` is the resync thread's target; `request` asks for a resync now, `wake` makes the thread
    look at `grace` again (the period follows it) or notice a stop."""

    def __init__(
        self,
        settings: Settings,
        mirror: Mirror,
        stats: WatchStats,
        stop: threading.Event,
        synced: threading.Event,
        grace: Callable[[], float | None],
        ask: Callable[[], None] = lambda: None,
    ) -> None:
        self.settings = settings
        self.mirror = mirror
        self.stats = stats
        self._stop = stop
        self.synced = synced
        self._grace = grace  # the leak grace period as configured last (None: unset)
        # Wakes the resync thread: a resync asked for (`_wanted`), the grace period changed (the period
        # follows it), or stop.  It sleeps until its next resync otherwise (it woke every second).
        self._now = threading.Event()
        self._wanted = False
        self._ask = ask  # ends the publisher's wait: a backstop pass is due (`take`)
        self._due = False

    def request(self) -> None:
        """Run a backstop pass now (then the period restarts)."""
        self._wanted = True
        self._now.set()

    def wake(self) -> None:
        self._now.set()

    def run(self) -> None:
        while not self.synced.wait(0.2):
            if self._stop.is_set():
                return
        last = time.monotonic()
        while not self._stop.is_set():
            due = last + self.settings.resync_period(self._grace())
            if self._now.wait(max(0.0, due - time.monotonic())):
                self._now.clear()
            if self._stop.is_set():
                return
            if not self._wanted and time.monotonic() < due:
                continue  # woken by a new grace period: the period is computed again
            self._wanted = False
            last = time.monotonic()
            if self.settings.backstop != "full":
                self._due = True  # the publisher runs it (`take`): the memory it reads is its own
                self._ask()
                continue
            try:
                added = self.mirror.mark_all_dirty(self.settings.resync_chunk, pause=self._pause)
            except _Stopping:
                return
            except redis.RedisError as exc:
                log.warning("resync failed, retrying at the next period: %s", exc)
                added = 0
            last = time.monotonic()
            self.stats.add("resyncs")
            log.info("full resync: %d allocations newly dirty", added)

    def take(self) -> bool:
        """The publisher's question after each batch: is a backstop pass due (then it runs it)?"""
        if not self._due:
            return False
        self._due = False
        return True

    def _pause(self) -> None:
        if self._stop.wait(self.settings.resync_pause_seconds):
            raise _Stopping
