"""The mirror's write generation: how the watcher notices that Redis lost what it wrote.

Why a module: Redis replicates asynchronously.  A Sentinel failover promotes a replica that may not have
received the last writes (acknowledged to the watcher, then lost), and a Redis restarted from an older AOF
or snapshot loses them too, while keeping everything else: the mirror then silently holds records older
than the watcher's memory, which it never reads back.  Every write pipeline of the watcher increments
`P:state.generation` (`producer/writes.py`), and every kick reads it (`producer/arming.py`); the watcher
knows the value it last wrote.  One lower than that (or any other than the next) means writes were lost
(or another writer is about): `on_lost` runs the backstop at once (`producer/backstop.py`: its audit
rewrites the records Redis lost, from the cluster; its sweep re-validates every allocation that may be
leaked, so lost leak timers start again, on the side of keeping IPs).  A mirror gone altogether (restarted
empty, FLUSHALL) is told apart by the `synced` field and ends the watcher to relist (`EXIT_MIRROR_LOST`).

A write that fails (the master killed under it, an `OOM` refusal) leaves the next value unknown, and the
watcher reloads its memory from Redis before it writes again (`producer/sending.py`): after a failover
that memory is the promoted replica's, without the lost writes, and compares equal to it.  So the highest
value Redis ever acknowledged (`acked`) is kept through that: a value found below it (or a write that
returns one not above it) is a loss too, and the watcher relists every kind on a loss (the relist's diff
against the API writes back what Redis lost, whatever the memory holds).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

log = logging.getLogger(__name__)


class Generation:
    """What this watcher last wrote of `P:state.generation`, and the check of each value Redis returns."""

    def __init__(self) -> None:
        self.expected: int | None = None  # None: nothing written yet, or a write's outcome is unknown
        self.acked: int | None = None  # the highest value Redis acknowledged to this watcher
        self.lost = 0  # losses noticed
        self.on_lost: Callable[[int, int], None] = lambda expected, found: None

    def wrote(self, value: int) -> None:
        """A write pipeline's HINCRBY returned `value`: it must follow the last one."""
        if self.expected is None and self.acked is not None and value <= self.acked:
            self._lost(self.acked, value - 1)  # after a failed write, the memory reloaded from Redis
        else:
            self._check(value - 1)
        self.expected = self.acked = value

    def seen(self, value: int | None) -> None:
        """A kick read `value` (None: absent, which the `synced` check handles).  Only a value below the
        last one written is a loss: a higher one may be a write of this watcher still in flight on
        another thread (the full resync's kick)."""
        if value is None:
            self.expected = self.acked = None
            return
        if self.expected is None and self.acked is not None and value < self.acked:
            self._lost(self.acked, value)  # after a failed write, the memory reloaded from Redis
            self.acked = value
            return
        if self.expected is not None and value < self.expected:
            self._check(value)
            self.expected = value

    def unknown(self) -> None:
        """A write failed half-way: whether its increment was applied is not known."""
        self.expected = None

    def _check(self, found: int) -> None:
        expected = self.expected
        if expected is None or found == expected:
            return
        self._lost(expected, found)

    def _lost(self, expected: int, found: int) -> None:
        self.lost += 1
        log.warning(
            "Redis holds write generation %d where this watcher last wrote %d: writes were lost (a failover "
            "or a restart from older data) or another watcher writes; running the backstop now",
            found,
            expected,
        )
        self.on_lost(expected, found)
