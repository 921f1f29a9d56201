"""The leader's handle gate: which pending decisions may be released now, judged on the mirror.

Its own module because it is the deciding half of a pass, reading Redis only: handle all-or-none across
shards — a handle's IPs go only when every allocation the handle index (`P:handles`) lists for it has a
pending decision that still matches the mirror (sequence number) — holds and their expiry, the pass cap
(`max_releases_per_pass`) and the rate limit; a live node's leak decided before the grace period
changed is dropped (`GlobalState.grace_since`).  What it lets through is judged once more live, against
the API, by `workers.leader.live_release` before anything is written.  What it drops on the mirror's word
(gone, another sequence number, held too long) goes back to the worker that decided it
(`LiveRelease.redecide`, its only writes): the mirror may have been caught mid-rebuild.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import redis

from shared.codec import RecordError
from shared.gcrecords import Decision, decode_handle_member, handle_member_range
from shared.keys import Keys, alloc_id_of
from shared.model import Allocation
from shared.records import decode_allocation
from shared.shard import shard_of
from workers.leader.audit import Result
from workers.leader.ledger import Ledger, Pending
from workers.leader.rate_limit import TokenBucket
from workers.leader.settings import LeaderSettings

log = logging.getLogger("workers.leader_gate")  # its pre-split name (#37): log lines unchanged


# A rate-limited backlog waits for this many seconds' worth of tokens between passes.
BATCH_TOKENS_SECONDS = 0.25


def _node_gone(group: list[Pending]) -> bool:
    return all(not p.decision.node_exists for p in group)


def _batch_wait(bucket: TokenBucket, waiting: int) -> float:
    """Seconds until `bucket` has tokens for `waiting` releases, or `BATCH_TOKENS_SECONDS`' worth."""
    return bucket.wait_for(max(1, min(waiting, int(BATCH_TOKENS_SECONDS * bucket.rate))))


class HandleGate:
    """Evaluates the handles due (`Ledger.due`): settles what the mirror already answers (gone, re-used,
    held too long), holds what waits for the rest of its handle, and hands on the rest."""

    def __init__(
        self,
        settings: LeaderSettings,
        client: redis.Redis,
        keys: Keys,
        shards: int,
        ledger: Ledger,
        bucket: TokenBucket,
        redecide: Callable[[Decision, float], None],
        node_bucket: TokenBucket | None = None,
    ) -> None:
        self.settings = settings
        self.redis = client
        self.keys = keys
        self.shards = shards
        self.ledger = ledger
        self.bucket = bucket
        # Deleted nodes' IPs (every decision of the handle made with the node gone) take this bucket's
        # tokens (`LeaderSettings.deleted_node_rate_limit`), the rest `bucket`'s (`rate_limit`).
        self.node_bucket = node_bucket if node_bucket is not None else bucket
        self.redecide = redecide  # `LiveRelease.redecide`: a dropped decision is the worker's again

    def ready(
        self, now: float, grace_since: float = 0.0
    ) -> tuple[list[list[Pending]], dict[str, Allocation | None]]:
        """Evaluate the handles due, oldest first, in chunks of what the pass cap and the rate limit still
        admit: the groups (one per handle) that may be released now, and the mirrored allocations of the
        decisions looked at.  The handles past the last chunk stay due as they were, for the next pass:
        a pass reads the mirror for what it can release, not for every handle due (a lost node's 110
        handles, rate-limited, were read again in each of the passes that released them)."""
        due = sorted(
            (h for h, t in self.ledger.due.items() if t <= now),
            key=lambda h: min(self.ledger.by_handle.get(h, {""})),
        )
        budget = self.settings.max_releases_per_pass
        ready: list[list[Pending]] = []
        mirrored: dict[str, Allocation | None] = {}
        while due:
            chunk, due = self._chunk(due, float(budget))
            if not chunk:
                break
            index, read = self._read_mirror(chunk)
            mirrored.update(read)
            for handle in chunk:
                group = self._evaluate(handle, index.get(handle, {}), mirrored, now, grace_since)
                if not group:
                    continue
                too_big = len(group) > budget and budget < self.settings.max_releases_per_pass
                bucket = self.node_bucket if _node_gone(group) else self.bucket
                if too_big or not bucket.take(len(group)):
                    self.ledger.due[handle] = now  # next pass (rate limit or pass cap)
                    continue
                budget -= len(group)
                ready.append(group)
        return ready, mirrored

    def _pending(self, handle: str) -> list[Pending]:
        return [
            self.ledger.pending[e] for e in self.ledger.by_handle.get(handle, ()) if e in self.ledger.pending
        ]

    def _bucket_of(self, handle: str) -> TokenBucket:
        """The bucket a handle's release takes tokens from: the deleted nodes' when every pending
        decision of it was made with its node gone."""
        group = self._pending(handle)
        return self.node_bucket if group and _node_gone(group) else self.bucket

    def _chunk(self, due: list[str], budget: float) -> tuple[list[str], list[str]]:
        """Of `due` (oldest first), the handles whose pending decisions fit what their bucket and the pass
        cap still admit, and the rest (at least one per bucket while it admits one release: a bigger
        handle is judged alone, and waits for room as before).  A handle that does not fit its bucket
        does not hold back one of the other bucket behind it."""
        rooms: dict[int, float] = {}
        chunk: list[str] = []
        rest: list[str] = []
        for handle in due:
            bucket = self._bucket_of(handle)
            first = id(bucket) not in rooms
            room = min(budget, bucket.available()) if first else rooms[id(bucket)]
            need = len(self.ledger.by_handle.get(handle, ()))
            if room >= 1 and (first or need <= room):
                chunk.append(handle)
                room -= need
            else:
                rest.append(handle)
            rooms[id(bucket)] = room
        return chunk, rest

    def next_due(self, now: float) -> float:
        """The time until the next handle is due (or the rate limit lets one go)."""
        if not self.ledger.due:
            return self.settings.idle_seconds
        soonest = min(self.ledger.due.values())
        if soonest <= now:
            # Rate-limited with a backlog: wait for a batch of tokens, not one (a pass re-sorts every
            # handle due: a pass per token, 50 a second, cost the leader 3× the CPU of the releases), and
            # only for a bucket some handle due is waiting on.
            live = gone = 0
            for handle, at in self.ledger.due.items():
                if at > now:
                    continue
                group = self._pending(handle)
                if group and _node_gone(group):
                    gone += len(group)
                else:
                    live += max(1, len(group))
            waits = [_batch_wait(self.bucket, live)] if live else []
            if gone:
                waits.append(_batch_wait(self.node_bucket, gone))
            return min(waits)
        return soonest - now

    def _read_mirror(
        self, handles: list[str]
    ) -> tuple[dict[str, dict[str, str]], dict[str, Allocation | None]]:
        """Handle indexes (alloc id → node attribute) and the mirrored allocations of pending decisions."""
        entries = [e for h in handles for e in sorted(self.ledger.by_handle.get(h, ()))]
        pipe = self.redis.pipeline(transaction=False)
        for h in handles:
            low, high = handle_member_range(h)
            pipe.zrange(self.keys.handles, low, high, bylex=True)
        for e in entries:
            d = self.ledger.pending[e].decision
            pipe.hget(self.keys.alloc(shard_of(d.node, self.shards)), d.alloc_id)
        replies = pipe.execute()
        index = {h: _handle_index(h, replies[i]) for i, h in enumerate(handles)}
        mirrored: dict[str, Allocation | None] = {}
        for e, raw in zip(entries, replies[len(handles) :], strict=True):
            alloc_id = self.ledger.pending[e].decision.alloc_id
            try:
                mirrored[alloc_id] = decode_allocation(alloc_id, raw) if raw is not None else None
            except RecordError as exc:
                log.warning("unreadable allocation record: %s", exc, extra={"alloc": alloc_id})
                mirrored[alloc_id] = None
        return index, mirrored

    def _evaluate(
        self,
        handle: str,
        index: dict[str, str],
        mirrored: dict[str, Allocation | None],
        now: float,
        grace_since: float = 0.0,
    ) -> list[Pending]:
        """The handle's decisions if all-or-none allows releasing them now, else [] (held or dropped).
        A live node's leak whose timer started before the grace period last changed (`grace_since`) is
        dropped and goes back to its worker, whose timer counts from the change: Calico restarts on that
        change and forgets its confirmed leaks (a gone node's leak needs no timer and stays)."""
        self.ledger.due.pop(handle, None)
        group: list[Pending] = []
        unreadable: list[str] = []
        for entry in sorted(self.ledger.by_handle.get(handle, ())):
            p = self.ledger.pending[entry]
            d = p.decision
            alloc = mirrored.get(d.alloc_id)
            # Dropped on the mirror's word, which may be caught mid-rebuild: the worker looks again.
            if alloc is None and d.alloc_id not in index:
                self.ledger.settle(p, Result.ALREADY_FREE, "the allocation is gone from the mirror", {}, now)
                self.redecide(d, now)
            elif alloc is not None and alloc.sequence_number != d.sequence_number:
                why = f"sequence number {alloc.sequence_number} since the decision ({d.sequence_number})"
                self.ledger.settle(p, Result.REFUSED_CONFLICT, why, {}, now)
                self.redecide(d, now)
            elif d.node_exists and d.first_seen < grace_since:
                why = (
                    "decided on a leak timer started before the grace period changed: the timer restarts "
                    "at the change (Calico restarts on it), and the worker decides again"
                )
                self.ledger.settle(p, Result.REFUSED_CONFLICT, why, {"grace_since": grace_since}, now)
                self.redecide(d, now)
            elif p.held_reason and now - d.decided_at >= self.settings.hold_expiry_seconds:
                why = "held too long: dropped (the worker decides again if it is still leaked)"
                self.ledger.settle(p, Result.HELD_BY_HANDLE, why, {}, now)
                self.redecide(d, now)
            else:
                if alloc is None:
                    unreadable.append(d.alloc_id)  # indexed, but no readable record: cannot judge it yet
                group.append(p)
        if not group:
            return []
        decided = {p.decision.alloc_id for p in group}
        waiting = sorted(set(index) - decided)
        unindexed = sorted(decided - set(index))
        if waiting or unindexed or unreadable:
            why = f"waiting for {len(waiting)} other allocation(s) of the handle: {', '.join(waiting[:5])}"
            if unindexed:
                why = f"not in the handle index yet: {', '.join(unindexed[:5])}"
            if unreadable:
                why = f"no readable allocation record: {', '.join(unreadable[:5])}"
            for p in group:
                self.ledger.note(p, Result.HELD_BY_HANDLE, why, {"handle_index": index}, now)
            self.ledger.due[handle] = now + self.settings.hold_recheck_seconds
            return []
        return group


def _handle_index(handle: str, members: list[bytes]) -> dict[str, str]:
    """alloc id → node attribute of a handle's members.  A member that cannot be read is an allocation we
    cannot name: it stands in the index under a name no decision has, so the handle waits (held)."""
    out: dict[str, str] = {}
    for m in members:
        try:
            h, f, node = decode_handle_member(m)
        except RecordError as exc:
            out[f"<unreadable handle index member {m[:40]!r}>"] = ""
            log.warning("%s", exc, extra={"handle": handle})
            continue
        if h == handle:  # always, by the range: a forged member of another handle is not this one's
            out[alloc_id_of(h, f)] = node
    return out
