"""The outcome of one validated batch, written in one pipeline together with the batch's ack.

Split from workers/shards/validate.py (the shard job) to keep that module readable: candidate timers (HSETNX,
so a timer written concurrently by another job keeps its earlier `first_seen`), due times (none in the
per-node baseline), cleared timers, and the release decisions of confirmed leaks with their evidence.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from typing import Protocol

import redis
from redis.typing import EncodableT, FieldT

from redisio.heldconn import HeldConnection
from redisio.shardqueue.queue import Lease, ShardQueue
from shared.allocrules import leak_grace
from shared.gcrecords import Candidate, Decided, Decision, encode_candidate, encode_decided, encode_decision
from shared.keys import DECISIONS_MAXLEN, REDECIDE_AFTER_SECONDS, Keys, pod_key
from shared.model import ATTR_NAMESPACE, ATTR_POD, Allocation
from shared.verdicts import AllocationType, LeakState, Lookup, Verdict
from workers.common import wakeups
from workers.common.redis_state import Entry, ShardReader, World
from workers.shards.metrics import record_batch

log = logging.getLogger("workers.validate")

# Confirmation is strictly after the grace period (`now - first_seen > grace`): a due time this much
# past its end guarantees the re-check confirms.
DUE_EPSILON_SECONDS = 0.001


class WritesCounts(Protocol):
    """The shard job's counters these writes add to (`workers.shards.validate.ShardStats`)."""

    validated: int
    candidates: int
    confirmed: int
    decisions: int


class WritesJob(Protocol):
    """The shard job (`workers.shards.validate._ShardJob`) as its batch's writes see it: an interface, so that
    this module does not import the one that imports it."""

    shard: int
    per_node: bool
    redis: redis.Redis
    keys: Keys
    queue: ShardQueue
    reader: ShardReader
    monotonic: Callable[[], float]
    held: HeldConnection | None  # a lingering job's kept connection for its pipelines

    @property
    def stats(self) -> WritesCounts: ...


class _Writes:
    """The outcome of one batch, written in one pipeline together with the ack."""

    def __init__(self, job: WritesJob, grace: float | None, now: float) -> None:
        self.job = job
        self.grace = grace
        self.now = now
        self.clear: set[str] = set()  # valid / ignored / vanished: no timer, no decision
        self.new_cands: dict[str, bytes] = {}  # HSETNX (keep an earlier first_seen written concurrently)
        self.reset_cands: dict[
            FieldT, EncodableT
        ] = {}  # HSET (the stored one is unreadable or for another seq)
        self.due: dict[str, float] = {}
        self.undue: set[str] = set()
        self.undecide: set[str] = set()
        self.confirmed: list[tuple[Verdict, Entry, bool, dict[str, str]]] = []
        self.validated = 0

    def record(self, v: Verdict, e: Entry, node_exists: bool, world: World) -> None:
        stats = self.job.stats
        stats.validated += 1
        self.validated += 1
        a = v.allocation
        if v.state in (LeakState.VALID, LeakState.IGNORED) or v.first_seen is None:
            self.clear.add(a.id)
            return
        timer_ok = (
            e.candidate is not None
            and e.candidate.sequence_number == a.sequence_number
            and e.candidate.first_seen == v.first_seen  # else restarted by a grace period change
        )
        if not timer_ok:
            record = encode_candidate(Candidate(v.first_seen, a.sequence_number))
            (self.reset_cands if e.candidate_stored else self.new_cands)[a.id] = record
        if v.state is LeakState.CANDIDATE:
            stats.candidates += 1
            grace = leak_grace(self.grace, v.type is AllocationType.VM)
            if grace and not self.job.per_node:  # grace 0 never confirms: no due time
                self.due[a.id] = v.first_seen + grace + DUE_EPSILON_SECONDS
            if e.decided_stored:
                self.undecide.add(a.id)
            return
        stats.confirmed += 1
        self.undue.add(a.id)
        d = e.decided
        if (
            d is None
            or d.sequence_number != a.sequence_number
            or self.now - d.emitted_at >= REDECIDE_AFTER_SECONDS
        ):
            self.confirmed.append((v, e, node_exists, _pod_evidence(a, world)))

    def queue(self, pipe: redis.client.Pipeline, lease: Lease, started: float) -> None:
        """The batch's writes and ack added to `pipe` (several shards' batches written in one round trip).
        Confirmed leaks first read their blocks' mirrored resourceVersions (a round trip of its own)."""
        job = self.job
        sk = job.keys.shard(job.shard)
        versions = job.reader.block_versions(v.allocation.block for v, *_ in self.confirmed)
        if self.clear:
            ids = sorted(self.clear)
            pipe.hdel(sk.cand, *ids)
            pipe.zrem(sk.due, *ids)
            pipe.hdel(sk.decided, *ids)
        for alloc_id, record in self.new_cands.items():
            pipe.hsetnx(sk.cand, alloc_id, record)
        if self.reset_cands:
            pipe.hset(sk.cand, mapping=self.reset_cands)
        if self.due:
            pipe.zadd(sk.due, self.due)
            wakeups.offer(pipe, job.keys, self.due.values())
        if self.undue:
            pipe.zrem(sk.due, *sorted(self.undue))
        if self.undecide:
            pipe.hdel(sk.decided, *sorted(self.undecide))
        for v, _e, exists, pod in self.confirmed:
            a = v.allocation
            decision = Decision(
                alloc_id=a.id,
                ip=a.ip,
                handle=a.handle,
                block=a.block,
                node=a.node,
                ordinal=a.ordinal,
                sequence_number=a.sequence_number,
                block_resource_version=versions.get(a.block, ""),
                type=str(v.type),
                reason=str(v.reason),
                node_exists=exists,
                pod=pod,
                first_seen=v.first_seen if v.first_seen is not None else self.now,
                decided_at=self.now,
                shard=job.shard,
            )
            fields: dict[FieldT, EncodableT] = {"id": a.id, "d": encode_decision(decision)}
            pipe.xadd(job.keys.decisions, fields, maxlen=DECISIONS_MAXLEN, approximate=True)
            pipe.hset(sk.decided, a.id, encode_decided(Decided(a.sequence_number, self.now)))
            log.info(
                "leak confirmed: %s (%s)",
                a.id,
                v.reason,
                extra={"shard": job.shard, "node": a.node, "handle": a.handle, "block": a.block},
            )
        job.stats.decisions += len(self.confirmed)
        job.queue.ack_in(pipe, lease)
        reasons = Counter(str(v.reason) for v, *_ in self.confirmed)
        record_batch(pipe, job.keys, job.monotonic() - started, self.validated, reasons)


def _pod_evidence(a: Allocation, world: World) -> dict[str, str]:
    ns, name = a.attrs.get(ATTR_NAMESPACE, ""), a.attrs.get(ATTR_POD, "")
    if not ns or not name:
        return {"lookup": "none"}
    view = world.pods.get(pod_key(ns, name), Lookup.UNKNOWN)
    if isinstance(view, Lookup):
        return {"lookup": view.value}
    ips = ",".join(view.pod_ips or ((view.pod_ip,) if view.pod_ip else ()))
    return {"lookup": "found", "uid": view.uid, "node": view.node_name, "phase": view.phase, "ips": ips}
