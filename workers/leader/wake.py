"""How an idle leader waits: until its wait is over, or a decision is appended to the stream first.

Its own module because it is a second, independent read of the decisions stream: a plain blocking XREAD
used only as a wake-up hint, never the fenced XREADGROUP that consumes decisions (`Fence.read`).  It
remembers the newest stream id the leader has read, so a decision appended while a pass ran ends the
next wait at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from redisio.client import blocking_client
from shared.keys import Keys


def _stream_id(raw: object) -> tuple[int, int]:
    """`b"1700000000000-3"` → (1700000000000, 3), for ordering stream ids."""
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


# Waits shorter than this are slept (tests step the leader with tiny waits); longer ones block on the
# decisions stream so that a new decision ends them at once.
WAKE_MIN_SECONDS = 0.2
# The longest one blocking read lasts: a stop (SIGTERM) or a lost Lease is noticed within this.  Each slice
# is a round trip of the idle floor (py-spy put the 1 s slices at a third of an idle leader's samples);
# 5 s stays far inside Kubernetes' 30 s termination grace, and a lost Lease is fenced at the write anyway.
WAKE_SLICE_SECONDS = 5.0


class DecisionWake:
    """The idle wait of a leader on the decisions stream (`Leader.idle`)."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.redis = blocking_client(client, WAKE_SLICE_SECONDS)
        self.keys = keys
        # The newest decisions-stream id this leader has read (or that existed when it first idled): its
        # idle wait blocks for entries after it, so one appended while a pass ran ends the wait at once.
        self._wake_from: tuple[int, int] | None = None

    def wait(self, stop: threading.Event, wait: float, held: Callable[[], bool]) -> None:
        """Wait `wait` seconds, or less if a decision is appended meanwhile: a blocking XREAD of entries
        newer than the last one in the stream is the wake-up (only a hint: the fenced XREADGROUP of the
        next pass is what reads them).  A decision appended between that pass's read and this wait is
        seen at the end of the wait at worst, as with plain polling."""
        if wait < WAKE_MIN_SECONDS:
            stop.wait(wait)
            return
        deadline = time.monotonic() + wait
        # In slices of at most `WAKE_SLICE_SECONDS`: a stop or a lost Lease is noticed within one.
        while not stop.is_set() and held() and (left := deadline - time.monotonic()) > 0:
            try:
                if self._wake_from is None:
                    newest = self.redis.xrevrange(self.keys.decisions, count=1)
                    self._wake_from = _stream_id(newest[0][0]) if newest else (0, 0)
                since = f"{self._wake_from[0]}-{self._wake_from[1]}"
                block = max(1, int(min(left, WAKE_SLICE_SECONDS) * 1000))
                reply = self.redis.xread({self.keys.decisions: since}, count=1, block=block)
            except (redis.RedisError, ValueError, IndexError):
                stop.wait(left)
                return
            if reply:
                return

    def seen(self, entries: list[Any]) -> None:
        """Remember the newest stream id read (the idle wait's starting point)."""
        for entry in entries:
            try:
                sid = _stream_id(entry[0])
            except (ValueError, IndexError, TypeError):
                continue
            if self._wake_from is None or sid > self._wake_from:
                self._wake_from = sid
