"""The audit trail of the leader: one entry in the `P:audit` stream per release and per refusal.

A wrong release is a duplicate IP in production, so every one the leader makes — and every one it
refuses — must be explainable afterwards: which IP, handle, block and node, which rule confirmed the leak,
what the live re-check saw, under which epoch, with what result.  Entries are plain strings (readable with
`redis-cli XRANGE`), evidence a JSON object; `ipamgc audit` prints them.

Stream entry fields (all strings):
- `v`: record layout version (`1`);
- `at`: when the outcome was recorded, epoch seconds on the leader's clock;
- `result`: a `Result` — `released`, `already-free`, `refused-valid`, `refused-conflict`,
  `held-by-handle`, `stale-epoch`, `dry-run`, `error`, `repaired` (the handle collector's: `ip` and
  `block` empty, `rule` `handle-<class>`, evidence `handle_gc`);
- `ip`, `handle`, `block`, `node`: the allocation (`ip` and `handle` empty for block records);
- `rule`: what confirmed it — the decision's reason (`pod-missing`, `node-missing`, …), or `empty-block`
  / `node-missing` for a block;
- `reason`: why this result (the re-check's verdict, the conflict, what the handle waits for, …);
- `evidence`: JSON — `decision` (stream id, type, sequence number, first seen, decided at, node
  existence and pod as the worker saw them, block resourceVersion, shard) and `recheck` (live node
  existence, where the pod was read, the pod, the verdict);
- `epoch`, `leader`: the fencing epoch and identity of the leader that recorded it;
- `decision`: the decision's stream entry id (empty for block records);
- `cluster`, `cluster_uid`: the cluster it was made against (`shared/cluster.py`: the API server URL and
  namespace kube-system's uid): the leader's records carry what the watcher recorded in `P:cluster`,
  `ipamgc release`'s its own.  Absent in records written before they existed (read as empty);
- `seq`: the record's sequence number, one above the last its writer gave (`workers/leader/audit_seq.py`):
  a record Redis lost leaves a gap that `ipamgc audit` reports.  Absent in older records (read as 0).

The stream lives in Redis, which can lose it (an emptyDir restart, a failover, a trim at `AUDIT_MAXLEN`):
every record is also one log line of the `ipamgc.audit` logger, level INFO whatever `--log-level` says,
whose message is the record as one JSON object (`log_line`: the stream entry's fields, evidence as an
object, no stream id), so that the cluster's log pipeline keeps it (docs/operations.md, "The audit
trail").  It is logged when the record is written, before the write, so a write that fails still leaves
the line.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

import orjson
import redis

from shared.cluster import ClusterIdentity, from_mapping
from shared.errors import PermanentError
from shared.gcrecords import Decision
from shared.keys import Keys
from workers.leader.audit_seq import AuditSequence, tail_seq
from workers.leader.election import Fence, LostLeadership

log = logging.getLogger("workers.audit")  # its pre-split name (#37): log lines unchanged
# One line per record, for the log pipeline: kept at INFO so that `--log-level WARNING` does not drop it.
audit_log = logging.getLogger("ipamgc.audit")
audit_log.setLevel(logging.INFO)

VERSION = "1"
# Approximate cap of the audit stream (XADD MAXLEN ~): about a day of heavy churn at a few releases a
# second, a bounded amount of memory if nobody reads it: ~830 bytes an entry of a pod's release with its
# evidence (measured 2026-12-04, redis-server 7.0, jemalloc), ~83 MB at the cap.
AUDIT_MAXLEN = 100_000


class Result(StrEnum):
    RELEASED = "released"  # written: the block (and the handle) no longer hold it
    ALREADY_FREE = "already-free"  # the block is gone or the ordinal free: nothing to write
    REFUSED_VALID = "refused-valid"  # the live re-check found it in use: the decision is dropped
    REFUSED_CONFLICT = "refused-conflict"  # sequence number or handle changed (re-used, stale): dropped
    HELD_BY_HANDLE = "held-by-handle"  # another IP of its handle has no confirmed decision: waits
    STALE_EPOCH = "stale-epoch"  # a newer leader exists: this one's work is refused
    DRY_RUN = "dry-run"  # what would have been done, in a dry run: nothing written
    REPAIRED = "repaired"  # an IPAMHandle written to agree with the blocks (docs/handles.md); no IP freed
    ERROR = "error"  # malformed decision, or an API error: nothing written for it


@dataclass(frozen=True, slots=True)
class AuditRecord:
    result: Result
    ip: str = ""
    handle: str = ""
    block: str = ""
    node: str = ""
    rule: str = ""
    reason: str = ""
    evidence: Mapping[str, Any] = field(default_factory=dict)
    epoch: int = 0
    leader: str = ""
    decision: str = ""
    at: float = 0.0
    id: str = ""  # the audit stream entry id, once read back
    cluster: str = ""  # the API server URL of the cluster it was made against ("" in older records)
    cluster_uid: str = ""  # that cluster's kube-system namespace uid ("": unknown)
    seq: int = 0  # its writer's sequence number (`workers/leader/audit_seq.py`; 0: older records)

    def stamped(self, identity: ClusterIdentity | None) -> AuditRecord:
        """This record, naming the cluster it was made against (unchanged without an identity)."""
        return self if identity is None else replace(self, cluster=identity.server, cluster_uid=identity.uid)

    @property
    def identity(self) -> ClusterIdentity | None:
        return ClusterIdentity(self.cluster, self.cluster_uid) if self.cluster or self.cluster_uid else None

    def to_fields(self) -> list[str]:
        """The flat field/value list of a stream entry."""
        return [
            "v",
            VERSION,
            "at",
            repr(self.at),
            "result",
            str(self.result),
            "ip",
            self.ip,
            "handle",
            self.handle,
            "block",
            self.block,
            "node",
            self.node,
            "rule",
            self.rule,
            "reason",
            self.reason,
            "evidence",
            orjson.dumps(self.evidence, default=str, option=orjson.OPT_SORT_KEYS).decode(),
            "epoch",
            str(self.epoch),
            "leader",
            self.leader,
            "decision",
            self.decision,
            "cluster",
            self.cluster,
            "cluster_uid",
            self.cluster_uid,
            "seq",
            str(self.seq),
        ]

    def log_line(self) -> str:
        """The record as one JSON object on one line: the stream entry's fields (`v` first), evidence as
        an object."""
        doc = {"v": VERSION, **self.as_json()}
        del doc["id"]  # the stream assigns it when it is written
        return orjson.dumps(doc, default=str).decode()

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "at": self.at,
            "result": str(self.result),
            "ip": self.ip,
            "handle": self.handle,
            "block": self.block,
            "node": self.node,
            "rule": self.rule,
            "reason": self.reason,
            "epoch": self.epoch,
            "leader": self.leader,
            "decision": self.decision,
            "cluster": self.cluster,
            "cluster_uid": self.cluster_uid,
            "seq": self.seq,
            "evidence": dict(self.evidence),
        }


class _Line:
    """A record's log line, encoded only if a handler formats it."""

    __slots__ = ("record",)

    def __init__(self, record: AuditRecord) -> None:
        self.record = record

    def __str__(self) -> str:
        return self.record.log_line()


def numbered(
    client: redis.Redis, keys: Keys, sequence: AuditSequence, records: Sequence[AuditRecord]
) -> tuple[list[AuditRecord], int]:
    """`records` with their sequence numbers (`sequence`, floored by the stream's newest; its memory alone
    when Redis does not answer), and how many numbers it gave were found lost."""
    stored: int | None = None
    if records:
        try:
            stored = tail_seq(client.xrevrange(keys.audit, count=1) or [])
        except redis.RedisError:
            stored = None
    first, lost = sequence.take(len(records), stored)
    return [replace(r, seq=first + i) for i, r in enumerate(records)], lost


def log_records(records: Iterable[AuditRecord]) -> None:
    """One `ipamgc.audit` line per record, for the log pipeline (the stream's copy outside Redis)."""
    for r in records:
        audit_log.info("%s", _Line(r))


def decision_record(
    entry: str, d: Decision, result: Result, reason: str, evidence: Mapping[str, Any], at: float
) -> AuditRecord:
    """The record of what became of decision `d` (stream entry `entry`): the worker's evidence under
    `decision`, the leader's own (`recheck`, `handle_index`) beside it."""
    decided = {
        "stream_id": entry,
        "type": d.type,
        "sequence_number": d.sequence_number,
        "first_seen": d.first_seen,
        "decided_at": d.decided_at,
        "node_exists": d.node_exists,
        "pod": dict(d.pod),
        "block_resource_version": d.block_resource_version,
        "shard": d.shard,
    }
    return AuditRecord(
        result=result,
        ip=d.ip,
        handle=d.handle,
        block=d.block,
        node=d.node,
        rule=d.reason,
        reason=reason,
        evidence={"decision": decided, **evidence},
        decision=entry,
        at=at,
    )


class UnreadableAuditEntry(PermanentError):
    pass


def _text(fields: Mapping[bytes, bytes], name: str) -> str:
    value = fields.get(name.encode())
    return value.decode("utf-8", errors="replace") if value is not None else ""


def decode_entry(entry_id: bytes | str, fields: Mapping[bytes, bytes]) -> AuditRecord:
    """A stream entry as a record; UnreadableAuditEntry when it is not one of ours."""
    if _text(fields, "v") != VERSION:
        raise UnreadableAuditEntry(f"unknown audit record version {_text(fields, 'v')!r}")
    try:
        evidence = orjson.loads(fields.get(b"evidence") or b"{}")
        return AuditRecord(
            result=Result(_text(fields, "result")),
            ip=_text(fields, "ip"),
            handle=_text(fields, "handle"),
            block=_text(fields, "block"),
            node=_text(fields, "node"),
            rule=_text(fields, "rule"),
            reason=_text(fields, "reason"),
            evidence=evidence if isinstance(evidence, dict) else {"value": evidence},
            epoch=int(_text(fields, "epoch") or 0),
            leader=_text(fields, "leader"),
            decision=_text(fields, "decision"),
            cluster=_text(fields, "cluster"),
            cluster_uid=_text(fields, "cluster_uid"),
            seq=int(_text(fields, "seq") or 0),
            at=float(_text(fields, "at") or 0.0),
            id=entry_id.decode() if isinstance(entry_id, bytes) else entry_id,
        )
    except (ValueError, orjson.JSONDecodeError) as exc:
        raise UnreadableAuditEntry(str(exc)) from exc


READ_PAGE = 1000  # entries per XREVRANGE while filtering


def read_audit(
    client: redis.Redis,
    keys: Keys,
    limit: int | None = None,
    keep: Callable[[AuditRecord], bool] | None = None,
    seqs: list[int] | None = None,
) -> tuple[list[AuditRecord], int]:
    """The newest `limit` records (all when None) that `keep` accepts (all without it), oldest first,
    and how many entries were unreadable.  Read newest first, a page at a time, until `limit` are kept.
    `seqs` collects the sequence number of every record read, kept or not (for `find_gaps`)."""
    if limit is not None and limit <= 0:
        return [], 0
    records: list[AuditRecord] = []
    bad = 0
    top = "+"
    page = READ_PAGE if keep is not None or limit is None else limit
    while limit is None or len(records) < limit:
        raw: list[Any] = list(client.xrevrange(keys.audit, max=top, count=page) or [])
        for entry_id, fields in raw:
            try:
                rec = decode_entry(entry_id, fields)
            except UnreadableAuditEntry as exc:
                bad += 1
                log.warning("unreadable audit entry %s: %s", entry_id, exc)
                continue
            if seqs is not None:
                seqs.append(rec.seq)
            if keep is None or keep(rec):
                records.append(rec)
                if limit is not None and len(records) == limit:
                    break
        if len(raw) < page:
            break
        last = raw[-1][0]
        top = "(" + (last.decode() if isinstance(last, bytes) else str(last))
    records.reverse()
    return records, bad


# Audit records per fenced script call (bounded Lua argument lists).
SETTLE_CHUNK = 200


class AuditTrail:
    """What a pass did, written when the pass ends: its audit records, and the acks of the decisions
    they settle, in the same fenced script (`Fence.settle`) — a decision is acked only with its record."""

    def __init__(self, fence: Fence, keys: Keys, group: str, now: Callable[[], float]) -> None:
        self.fence = fence
        self.keys = keys
        self.group = group
        self.now = now
        self._records: list[AuditRecord] = []
        self._acks: list[str] = []
        self.sequence = AuditSequence()
        self.on_lost: Callable[[int], None] = lambda n: None  # audit records found lost from the stream

    def record(self, rec: AuditRecord) -> None:
        """Queue a record, stamped with the leader's epoch and identity."""
        stamped = replace(
            rec, epoch=self.fence.epoch, leader=self.fence.leadership.identity, at=rec.at or self.now()
        )
        self._records.append(stamped)

    def ack(self, entry: str) -> None:
        self._acks.append(entry)

    def flush(self) -> None:
        """Write the queued records and acks; LostLeadership when the epoch is no longer ours (the
        records are written anyway, the decisions stay unacked for the next leader)."""
        records, acks = self._records, self._acks
        self._records, self._acks = [], []
        chunks = -(-max(len(records), len(acks)) // SETTLE_CHUNK)
        for i in range(chunks):
            part = records[i * SETTLE_CHUNK : (i + 1) * SETTLE_CHUNK]
            ids = acks[i * SETTLE_CHUNK : (i + 1) * SETTLE_CHUNK]
            if not self._settle(part, ids):
                self._records = records[(i + 1) * SETTLE_CHUNK :]
                raise LostLeadership(f"epoch {self.fence.epoch} is stale: {len(ids)} decisions left unacked")

    def flush_unacked(self) -> None:
        """After the leadership is lost: write the queued records, ack nothing; best effort."""
        records = self._records
        self._records, self._acks = [], []
        try:
            for i in range(0, len(records), SETTLE_CHUNK):
                self._settle(records[i : i + SETTLE_CHUNK], [])
        except redis.RedisError as exc:
            log.warning("could not record the refusals: %s", exc, extra=self.fence.extra)

    def _settle(self, records: Sequence[AuditRecord], acks: Sequence[str]) -> bool:
        # The cluster the watcher collects (`P:cluster`): the one whose data these decisions came from.
        identity = None
        try:
            identity = from_mapping(self.fence.redis.hgetall(self.keys.cluster)) if records else None
        finally:  # logged whether or not Redis answers: the log is the copy that outlives it
            stamped, lost = numbered(self.fence.redis, self.keys, self.sequence, records)
            stamped = [r.stamped(identity) for r in stamped]
            log_records(stamped)
            if lost:
                self.on_lost(lost)
        return self.fence.settle(
            self.keys.audit,
            AUDIT_MAXLEN,
            [r.to_fields() for r in stamped],
            self.keys.decisions,
            self.group,
            acks,
        )
