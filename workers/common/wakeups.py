"""Telling the watcher when a grace period ends, so that nothing has to poll for it.

A candidate's due time (`due:{s}`) is written by a shard job, or by the leader when it hands a decision
back.  The watcher's kick is what arms a shard once one passes; it used to find them by running every
`kick_interval` (1 s in the benchmark, the largest share of an idle watcher's CPU).  Now every writer of a
due time also offers it to `P:wakeups`, a sorted set that keeps only its earliest member, and the watcher
blocks on it (BZPOPMIN, `producer/wakeups.py`) and kicks at that time.  The set is a hint: the due times
stay in `due:{s}`, and each kick reads the next one from there (`producer/arming.py`).
"""

from __future__ import annotations

from collections.abc import Iterable

import redis

from shared.keys import Keys

# Members `P:wakeups` keeps, the earliest: the watcher needs only the next time to wake (each kick reads
# the one after it from `due:{s}`), and a watcher that is down cannot let it grow.
WAKEUPS_KEPT = 1


def offer(pipe: redis.client.Pipeline | redis.Redis, keys: Keys, due: Iterable[float]) -> None:
    """Add the earliest of `due` (epoch seconds) to `P:wakeups`, in `pipe` (nothing when empty)."""
    earliest = min(due, default=None)
    if earliest is None:
        return
    pipe.zadd(keys.wakeups, {repr(earliest): earliest})
    pipe.zremrangebyrank(keys.wakeups, WAKEUPS_KEPT, -1)
