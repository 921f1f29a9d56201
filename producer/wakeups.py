"""When the watcher kicks: at the next due time, not on a poll.

The kick (`producer/arming.py`) arms the shards whose candidates came due or whose worker died.  It runs
when the earliest time anyone knows of passes: the one the last kick read from `due:{s}` and
`inflight:{s}`, or one a worker or the leader wrote since, which they offer on `P:wakeups`
(`workers/common/wakeups.py`) and this module's thread takes with a blocking BZPOPMIN.  Otherwise the
watcher kicks once every `kick_interval_seconds` (a ceiling: it also notices a Redis that lost the mirror
and a job that was armed but never ran).  An idle watcher thus makes one round trip per ceiling and one
per wait, where it made one a second.

`KickSchedule` is the time of the next kick, shared by the thread and the publish loop; `Wakeups` is the
thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import redis

from redisio.client import blocking_client
from shared.keys import Keys

log = logging.getLogger(__name__)

# The longest one BZPOPMIN blocks (seconds): a stopping watcher leaves the thread at most this long (it is
# a daemon, never joined), and each return is one round trip of the idle floor.
WAIT_SECONDS = 30.0
# After a Redis error, the thread waits this long before it blocks again (the ceiling kick covers the gap).
ERROR_PAUSE_SECONDS = 5.0


class KickSchedule:
    """The monotonic time of the next kick: lowered by `offer` from any thread, set by `kicked` in the
    publish loop.  `wake` ends the publish loop's wait when the time moved earlier."""

    def __init__(self, ceiling: float, wake: Callable[[], None], monotonic: Callable[[], float]) -> None:
        self.ceiling = ceiling
        self._wake = wake
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self.at = monotonic() + ceiling
        # The earliest offer since the running kick started (that kick's read may not have seen it).
        self._since = float("inf")

    def due(self) -> bool:
        return self._monotonic() >= self.at

    def left(self) -> float:
        """Seconds until the next kick (0 when it is due)."""
        return max(0.0, self.at - self._monotonic())

    def offer(self, at: float) -> None:
        """Kick no later than monotonic time `at`."""
        with self._lock:
            self._since = min(self._since, at)
            earlier = at < self.at
            if earlier:
                self.at = at
        if earlier:
            self._wake()

    def kicking(self) -> None:
        """A kick is about to read the shards: offers from now on outlive what it reads."""
        with self._lock:
            self._since = float("inf")

    def kicked(self, next_in: float | None) -> None:
        """A kick ran: the next one in `next_in` seconds (what it read as due next), else the ceiling,
        unless an offer made while it ran is earlier."""
        ceiling = self.ceiling if next_in is None else min(self.ceiling, max(0.0, next_in))
        with self._lock:
            self.at = min(self._monotonic() + ceiling, self._since)


class Wakeups:
    """The thread that blocks on `P:wakeups` and moves the kick to each due time offered there."""

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        schedule: KickSchedule,
        now: Callable[[], float],
        stop: threading.Event,
        *,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.redis = blocking_client(client, WAIT_SECONDS)
        self.key = keys.wakeups
        self.schedule = schedule
        self.now = now  # the clock of the due times (the mirror's: Redis TIME)
        self.stop = stop
        self.monotonic = monotonic

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                reply = self.redis.bzpopmin(self.key, timeout=WAIT_SECONDS)
            except redis.RedisError as exc:
                if self.stop.is_set():
                    return
                log.warning("wakeups: %s; the kick falls back to its interval for now", exc)
                self.stop.wait(ERROR_PAUSE_SECONDS)
                continue
            if reply:
                self.take(float(reply[2]))

    def take(self, due: float) -> None:
        """Kick when epoch time `due` comes."""
        self.schedule.offer(self.monotonic() + (due - self.now()))
