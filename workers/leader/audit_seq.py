"""The audit records' sequence numbers, and the gaps a reader finds in them.

Why a module: the audit stream lives in Redis, and a Redis that fails over to a replica that missed the
last writes (or restarts from older data, or refuses writes at its maxmemory) loses the last records
without a word.  Each record carries `seq`, a number one above the last one its writer gave, so that a
lost record leaves a hole a reader can name ("3 records lost between seq 41 and 45") instead of just
missing.

Where the number comes from: the writer's own counter in memory (`AuditSequence.last`), floored by the
highest number the stream's newest entry holds (the other writers: the leader of another term, `ipamgc
release --from-report`).  Redis going back therefore does not take the number back with it: the next
record of the same leader is numbered above the lost ones, and the gap shows.  The same number is in the
record's `ipamgc.audit` log line (logged before the write), so the lost records themselves are in the log
pipeline, found by their numbers.  A writer that restarts after the loss starts again from the stream's
newest number; a lost record's number may then be given again (the log line tells the two apart by `at`
and `leader`): a gap shows only while the writer that wrote the lost records keeps running, which is what
a failover or an OOM refusal does to the leader (it reconnects; it is not restarted).

Records written before numbers existed carry none (read as 0) and are left out of the gap check.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("workers.audit")


def tail_seq(entries: Iterable[Any]) -> int:
    """The `seq` of the newest stream entry (`XREVRANGE … COUNT 1`'s answer): 0 when the stream is empty or
    the entry has none (or an unreadable one)."""
    for _entry_id, fields in entries:
        raw = fields.get(b"seq") if isinstance(fields, dict) else None
        try:
            return max(0, int(raw)) if raw is not None else 0
        except ValueError:
            return 0
    return 0


class AuditSequence:
    """One writer's sequence numbers: `take(n, stored)` gives the first of `n` new ones."""

    def __init__(self) -> None:
        self.last = 0  # the highest number this process gave (0: none yet)
        self.lost = 0  # numbers this process gave that the stream was later found not to hold

    def take(self, n: int, stored: int | None) -> tuple[int, int]:
        """(first, lost now): numbers first … first+n-1, above both this writer's last one and the
        stream's newest (`stored`; None when it could not be read: this writer's memory alone).
        `lost now` counts numbers this writer gave above the stream's newest: records the stream lost
        (a failover, a rollback, a write Redis refused)."""
        lost = 0
        if stored is not None and stored < self.last:
            lost = self.last - stored
            self.lost += lost
            log.warning(
                "the audit stream's newest record is seq %d where this leader last wrote seq %d: %d audit "
                "records lost from Redis (kept in the ipamgc.audit log lines)",
                stored,
                self.last,
                lost,
            )
        first = max(self.last, stored or 0) + 1
        self.last = first + n - 1 if n > 0 else self.last
        return first, lost


@dataclass(frozen=True, slots=True)
class Gap:
    """Records numbered `after`+1 … `before`-1 are not in the stream."""

    after: int
    before: int

    @property
    def lost(self) -> int:
        return self.before - self.after - 1

    def __str__(self) -> str:
        s = "" if self.lost == 1 else "s"
        return f"{self.lost} record{s} lost between seq {self.after} and {self.before}"


def find_gaps(seqs: Iterable[int]) -> list[Gap]:
    """The holes in a set of sequence numbers (0s, records without one, ignored), lowest first.  The
    numbers of several writers interleave in the stream: it is the set that must have no holes."""
    ordered = sorted({s for s in seqs if s > 0})
    return [Gap(a, b) for a, b in itertools.pairwise(ordered) if b > a + 1]
