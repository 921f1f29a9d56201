"""The leader's ledger: the decisions it has read and not yet acked, and how each one ends.

Its own module because it is the one piece of leader state every step shares — the stream intake, the
handle gate (`workers.leader.gate`), the live release (`workers.leader.live_release`) and the loss of the
leadership (`Leader.abandon`) — and the one place a decision is settled: recorded in the audit trail and
acked together (`settle`), or noted as waiting, once per distinct reason (`note`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from shared.codec import RecordError
from shared.gcrecords import Decision, decode_decision
from shared.model import allocation_id, sanitize_handle
from shared.netaddr import AddressError, canonical_ip, ip_to_ordinal, parse_network
from workers.leader.audit import AuditRecord, AuditTrail, Result, decision_record

log = logging.getLogger("workers.leader_ledger")  # its pre-split name (#37): log lines unchanged


@dataclass(slots=True)
class Pending:
    """A decision read and not yet acked."""

    entry: str  # stream entry id
    decision: Decision
    held_reason: str = ""  # last held-by-handle / error reason recorded (one audit record per change)


@dataclass(slots=True)
class LeaderStats:
    read: int = 0
    malformed: int = 0
    superseded: int = 0
    held: int = 0
    released: int = 0
    already_free: int = 0
    refused_valid: int = 0
    refused_conflict: int = 0
    errors: int = 0
    dry_run: int = 0
    passes: int = 0


class Ledger:
    """Pending decisions by stream entry, allocation and (sanitised) handle, and when each handle is due
    to be looked at again.  `record` is the leader's (the audit trail and the metrics)."""

    def __init__(
        self,
        trail: AuditTrail,
        record: Callable[[AuditRecord], None],
        extra: Callable[[], dict[str, Any]],
    ) -> None:
        self.trail = trail
        self.record = record
        self.extra = extra
        self.stats = LeaderStats()
        self.pending: dict[str, Pending] = {}  # entry id → decision
        self.by_alloc: dict[str, str] = {}  # alloc id → entry id
        self.by_handle: dict[str, set[str]] = {}  # sanitised handle → entry ids
        self.due: dict[str, float] = {}  # sanitised handle → when to look again

    def intake(self, entries: Iterable[Any]) -> None:
        """Take stream entries in: a malformed one is recorded and acked, a duplicate of a pending
        decision (same allocation) supersedes the older one, which is acked."""
        for raw_id, flat in entries:
            entry = raw_id.decode() if isinstance(raw_id, bytes) else str(raw_id)
            if entry in self.pending:
                continue
            self.stats.read += 1
            fields = dict(zip(flat[::2], flat[1::2], strict=True)) if isinstance(flat, list) else {}
            try:
                decision = _valid(decode_decision(fields.get(b"d", b"")))
            except (RecordError, AddressError, ValueError) as exc:
                self.stats.malformed += 1
                log.warning("malformed decision %s acked and skipped: %s", entry, exc, extra=self.extra())
                record = AuditRecord(Result.ERROR, reason=f"malformed decision: {exc}", decision=entry)
                self.record(record)
                self.trail.ack(entry)
                continue
            older = self.by_alloc.get(decision.alloc_id)
            if older is not None:
                keep_new = (decision.decided_at, entry) >= (self.pending[older].decision.decided_at, older)
                loser = older if keep_new else entry
                self.stats.superseded += 1
                self.trail.ack(loser)
                if not keep_new:
                    continue
                self.drop(older)
            self.pending[entry] = Pending(entry, decision)
            self.by_alloc[decision.alloc_id] = entry
            handle = sanitize_handle(decision.handle)
            self.by_handle.setdefault(handle, set()).add(entry)
            self.due[handle] = float("-inf")

    def drop(self, entry: str) -> None:
        p = self.pending.pop(entry)
        if self.by_alloc.get(p.decision.alloc_id) == entry:
            del self.by_alloc[p.decision.alloc_id]
        handle = sanitize_handle(p.decision.handle)
        members = self.by_handle.get(handle)
        if members is not None:
            members.discard(entry)
            if not members:
                del self.by_handle[handle]
                self.due.pop(handle, None)

    def audit(
        self, p: Pending, result: Result, reason: str, evidence: dict[str, Any], now: float
    ) -> AuditRecord:
        """`evidence`: what this leader saw (`recheck`, `handle_index`), beside the decision's own."""
        return decision_record(p.entry, p.decision, result, reason, evidence, now)

    def settle(self, p: Pending, result: Result, reason: str, evidence: dict[str, Any], now: float) -> None:
        """The decision is fully handled: record it and ack it (at the next flush)."""
        self.record(self.audit(p, result, reason, evidence, now))
        self.trail.ack(p.entry)
        self.drop(p.entry)
        counter = result.value.replace("-", "_")
        if hasattr(self.stats, counter):
            setattr(self.stats, counter, getattr(self.stats, counter) + 1)

    def note(self, p: Pending, result: Result, reason: str, evidence: dict[str, Any], now: float) -> None:
        """The decision waits: record why, once per distinct reason."""
        if p.held_reason != reason:
            p.held_reason = reason
            self.record(self.audit(p, result, reason, evidence, now))
            if result is Result.HELD_BY_HANDLE:
                self.stats.held += 1
            else:
                self.stats.errors += 1


def _valid(d: Decision) -> Decision:
    """A decision whose fields agree with each other (ValueError/AddressError otherwise)."""
    if not d.handle or not d.node:
        raise ValueError("decision without a handle or a node")
    if canonical_ip(d.ip) != d.ip:
        raise ValueError(f"IP {d.ip!r} is not canonical")
    net = parse_network(d.block)
    if ip_to_ordinal(net, d.ip) != d.ordinal:
        raise ValueError(f"ordinal {d.ordinal} is not {d.ip} in {d.block}")
    if allocation_id(d.handle, d.ip) != d.alloc_id:
        raise ValueError(f"allocation id {d.alloc_id!r} does not name {d.handle}/{d.ip}")
    return d
