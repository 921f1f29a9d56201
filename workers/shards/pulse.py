"""How a lingering shard job waits for work: the watcher's pulse stream, read with a blocking XREAD.

Its own module because the wait is the job's only blocking I/O and its one substitution point: the tests
step a lingering job on fake time with a pulse of their own (`Pulse`), and the longest single wait
(`POLL_SECONDS`) is shared by the job (`workers.shards.linger.Linger`) and the worker's tuning
(`workers.shards.job_tuning.JobTuning`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import redis

from redisio.heldconn import HeldConnection, run
from shared.keys import PULSE_SHARDS, PULSES_MAXLEN, Keys

# The longest single wait for a pulse, the default of `Linger.poll` and `JobTuning.poll` (one constant: the
# two defaults once differed, 1 s and 0.3 s, and a waiting job of `ipamgc work` sent ~3.5 XREADs a second).
POLL_SECONDS = 1.0
# The shortest wait for a pulse (XREAD's BLOCK is in milliseconds; a shorter one would spin).
MIN_WAIT_SECONDS = 0.001


class Pulse(Protocol):
    """The watcher's pulse as a lingering job waits for it (`StreamPulse`; the tests' is on fake time)."""

    def newest(self) -> bytes:
        """The newest pulse's id (`0-0` when there is none)."""
        ...

    def wait(self, since: bytes, timeout: float) -> bytes:
        """The newest pulse's id once one newer than `since` arrived, or `since` after `timeout` s."""
        ...

    def take_named(self) -> frozenset[int] | None:
        """The shards named by the pulses `wait` read since the last call (then forgotten); None when
        one of them named none or some may have been missed (the stream is capped): look at every shard."""
        ...


class StreamPulse:
    """`P:pulses` read with XREAD BLOCK: a job wakes when the watcher appends, not on a poll."""

    def __init__(self, client: redis.Redis, keys: Keys, held: HeldConnection | None = None) -> None:
        self.redis, self.key = client, keys.pulses
        self.held = held  # the job's kept connection (`redisio.heldconn`): a wait is its commonest command
        self._named: set[int] | None = set()

    def newest(self) -> bytes:
        last = self.redis.xrevrange(self.key, count=1)
        return _entry_id(last[-1]) if last else b"0-0"

    def wait(self, since: bytes, timeout: float) -> bytes:
        block = max(1, int(timeout * 1000))
        pipe = self.redis.pipeline(transaction=False)
        pipe.xread({self.key: since}, count=PULSES_MAXLEN, block=block)
        reply: Any = run(pipe, self.held)[0]
        if not reply:
            return since
        entries = reply[0][1]  # RESP2: [[key, [(id, fields), ...]]]
        if entries:
            self._named = merge_named(self._named, entries, capped=len(entries) >= PULSES_MAXLEN)
        return _entry_id(entries[-1]) if entries else since

    def take_named(self) -> frozenset[int] | None:
        named, self._named = self._named, set()
        return None if named is None else frozenset(named)


_FIELD = PULSE_SHARDS.encode()


def merge_named(named: set[int] | None, entries: Sequence[Any], *, capped: bool) -> set[int] | None:
    """`named` plus the shards the pulse `entries` name; None (every shard) once one names none (a
    watcher of an earlier version), is unreadable, or the read may have missed some (`capped`)."""
    if named is None or capped:
        return None
    for entry in entries:
        fields = entry[1] if isinstance(entry, list | tuple) and len(entry) > 1 else None
        raw = fields.get(_FIELD, fields.get(PULSE_SHARDS)) if isinstance(fields, dict) else None
        if not isinstance(raw, bytes | str):
            return None
        if isinstance(raw, str):
            raw = raw.encode()
        try:
            named.update(int(x) for x in raw.split(b",") if x)
        except ValueError:
            return None
    return named


def _entry_id(entry: object) -> bytes:
    raw = entry[0] if isinstance(entry, list | tuple) and entry else b"0-0"
    return raw if isinstance(raw, bytes) else str(raw).encode()
