"""The leader: the one writer.  It releases confirmed leaks safely and cleans empty blocks and deleted nodes.

One pass (`Leader.step`), under a fencing epoch (`workers.election`):
1. read new decisions from the `decisions` stream through a consumer group (fenced XREADGROUP; after an
   election every pending entry of every consumer is reclaimed with XAUTOCLAIM); a malformed entry is
   logged, counted, recorded and acked, never released;
2. collect decisions per (sanitised) handle and enforce handle all-or-none across shards: a handle's IPs
   go only when every allocation the handle index (`P:handles`) lists for it has a pending decision that
   still matches the mirror (sequence number); otherwise they wait, re-evaluated on each new decision for
   the handle and every `hold_recheck_seconds` (never spinning), and are dropped once older than the
   worker's re-decide period (the worker sends a fresh one if the leak persists);
3. re-check each allocation against the live API right before releasing (spec §3.9,
   `workers.release.Rechecker`);
   valid now, or the API could not answer (Calico: valid, timer restarted) ⇒ the decision is dropped
   (`refused-valid`);
4. release per block with (ip, handle, sequence number) (`workers.release`), at most
   `max_releases_per_pass` IPs a pass and `rate_limit` a second; a conflict drops the decision;
5. every few seconds, deleted nodes and empty blocks (`workers.cleanup`, `workers.empty_blocks`), and a
   backstop scan of every block record every `empty_block_backstop_seconds`.
Each decision is acked only once fully handled (released, already free, refused or superseded), in the
same fenced script that appends its audit record.  Losing the Lease or the epoch stops the pass at the
next write; `run()` then returns `EXIT_LOST` and the supervisor restarts the process as a standby.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import redis

from shared.clock import Clock, ServerClock
from shared.codec import RecordError
from shared.config import Settings, redis_client
from shared.errors import MalformedObject
from shared.keys import REDECIDE_AFTER_SECONDS, Keys, alloc_id_of
from shared.model import Allocation, allocation_id, sanitize_handle
from shared.netaddr import AddressError, canonical_ip, ip_to_ordinal, parse_network
from shared.records import (
    Decision,
    decode_allocation,
    decode_decision,
    decode_handle_member,
    handle_member_range,
)
from shared.shard import shard_of
from workers import kube
from workers.audit import AuditRecord, AuditTrail, Result, decision_record
from workers.cleanup import Context, DeletedNodes
from workers.cooldown import ColdIPs, effective_cooldown, mirrored_cooldown
from workers.election import Elector, Fence, Leadership, LostLeadership, default_identity
from workers.empty_blocks import EmptyBlocks
from workers.metrics import LeaderMetrics
from workers.redis_state import read_state
from workers.release import BlockReleaser, ObjectApi, Rechecker, Request, TokenBucket

log = logging.getLogger(__name__)

EXIT_STOPPED = 0  # asked to stop
EXIT_CONFIG = 2  # bad settings
EXIT_LOST = 3  # lost the Lease or the epoch: restart as a standby
GROUP = "leader"
DRY_RUN_GROUP = "leader-dry-run"  # a dry run never consumes the real leader's decisions


def _stream_id(raw: object) -> tuple[int, int]:
    """`b"1700000000000-3"` → (1700000000000, 3), for ordering stream ids."""
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


# Waits shorter than this are slept (tests step the leader with tiny waits); longer ones block on the
# decisions stream so that a new decision ends them at once.
WAKE_MIN_SECONDS = 0.2


@dataclass(frozen=True, slots=True)
class LeaderSettings:
    """`ipamgc lead` on top of the shared settings (Redis, kubeconfig, grace override, election timing)."""

    base: Settings = field(default_factory=Settings)
    dry_run: bool = False
    lease_namespace: str | None = None  # None: the election namespace of `base` (POD_NAMESPACE, kube-system)
    lease_name: str = "ipamgc-leader"  # not the watcher's Lease: the two elect independently
    identity: str | None = None  # None: hostname-pid-random
    # IP releases per second (token bucket, burst one second's worth); 0: unlimited.  One release is ~4
    # API calls (block GET+PUT, handle GET+PUT): 50/s stays within Calico's client budget (QPS 100,
    # burst 200) while freeing a 150,000-pod cluster's worth of a dead zone in under an hour.
    rate_limit: float = 50.0
    # Calico's `maxBatchSize`: at most this many IPs released per pass.
    max_releases_per_pass: int = 10_000
    # Decisions read per XREADGROUP; a full read means more are waiting (no idle wait then).
    read_count: int = 1000
    # Seconds between passes when there is nothing to read.  The wait ends early when a decision arrives
    # (a blocking XREAD on the stream, `Leader.idle`), and no later than the next cleanup pass or
    # heartbeat, so this bounds only the cost of an idle leader, not the latency of a release.  At one
    # pass a second the whole idle leader took 1.7 ms of CPU a second in `ipamgc bench`'s idle phase
    # (its Lease renewals included); with this and the watcher's one-round-trip kick, the idle phase's
    # Redis commands fell from 29.8 to 25.7 a second.
    idle_seconds: float = 5.0
    # Seconds before a handle waiting for its other IPs (or an API that failed) is looked at again.
    hold_recheck_seconds: float = 5.0
    # A held decision older than this is dropped: the worker re-sends a live leak after this long.
    hold_expiry_seconds: float = REDECIDE_AFTER_SECONDS
    # Seconds between deleted-node passes (cheap: a few set reads) and empty-block passes.  An empty-block
    # pass reads only the watcher's index of empty blocks and their hosts (two round trips, a handful of
    # fields), so it runs with every cleanup pass: an empty block goes within 5 s of its grace period's
    # end, not 30 s, and the pass no longer delays leak releases.
    cleanup_interval_seconds: float = 5.0
    empty_block_interval_seconds: float = 5.0
    # Seconds between backstop scans of every block record (~0.4 CPU s at 5,000 blocks / 150,000
    # allocations): orphaned host blocks whose node delete was missed, and empty blocks missing from the
    # index.  Both need data loss or a watcher bug, and the watcher relists every 5 minutes by default
    # (its resync period without a grace period), so that is the backstop's period too: ~0.1% of a core.
    # A leader also scans on its term's first pass and when the mirror is rebuilt (not synced → synced:
    # Redis lost data), when orphans are likeliest.
    empty_block_backstop_seconds: float = 300.0
    # Seconds between the fence's `heartbeat` writes (read by `ipamgc status` only, as an age).
    heartbeat_seconds: float = 5.0

    @property
    def namespace(self) -> str:
        return self.lease_namespace or self.base.election_namespace

    @classmethod
    def of(cls, settings: Settings | LeaderSettings) -> LeaderSettings:
        return settings if isinstance(settings, LeaderSettings) else cls(base=settings)


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


class Leader:
    """The work of an elected leader (see the module docstring).  `step()` is one pass."""

    def __init__(
        self,
        settings: LeaderSettings,
        client: redis.Redis,
        api: ObjectApi,
        leadership: Leadership,
        *,
        clock: Clock | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        metrics: LeaderMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics if metrics is not None else LeaderMetrics()
        self.redis = client
        self.keys: Keys = settings.base.keys
        self.api = api
        self.clock = clock or ServerClock(client)  # Redis TIME: the workers' clock too
        self.leadership = leadership
        self.identity = leadership.identity
        self.fence = Fence(client, self.keys, settings.lease_name, leadership)
        self.group = DRY_RUN_GROUP if settings.dry_run else GROUP
        self.shards = settings.base.shards
        self.bucket = TokenBucket(settings.rate_limit, monotonic=monotonic)
        self.stats = LeaderStats()
        self.pending: dict[str, Pending] = {}  # entry id → decision
        self.by_alloc: dict[str, str] = {}  # alloc id → entry id
        self.by_handle: dict[str, set[str]] = {}  # sanitised handle → entry ids
        self.due: dict[str, float] = {}  # sanitised handle → when to look again
        self.released: dict[str, float] = {}  # alloc id → when this leader released it
        self.trail = AuditTrail(self.fence, self.keys, self.group, self.clock.now)
        self._next_cleanup = float("-inf")
        self._next_empty = float("-inf")
        self._next_backstop = float("-inf")  # the first pass of a term scans: unindexed blocks, orphans
        self._next_heartbeat = float("-inf")
        self._gated = False
        # The newest decisions-stream id this leader has read (or that existed when it first idled): its
        # idle wait blocks for entries after it, so one appended while a pass ran ends the wait at once.
        self._wake_from: tuple[int, int] | None = None
        ctx = Context(
            client,
            self.keys,
            api,
            self.fence.check,
            self.fence.write,
            self.shards,
            settings.dry_run,
            self.record,
        )
        self.deleted = DeletedNodes(ctx)
        self.empty = EmptyBlocks(ctx, self.deleted)
        self.cold = ColdIPs(ctx)

    @property
    def extra(self) -> dict[str, Any]:
        return {"epoch": self.fence.epoch, "identity": self.identity}

    # -- lifecycle ------------------------------------------------------------------------------------

    def start(self) -> int:
        """On acquiring the Lease: a new epoch, the consumer group, and every pending entry reclaimed."""
        epoch = self.fence.acquire(self.clock.now())
        self.metrics.led(epoch)
        try:
            self.redis.xgroup_create(self.keys.decisions, self.group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        claimed = self.fence.claim(
            self.keys.decisions, self.group, self.identity, 0, self.settings.read_count
        )
        if claimed:
            log.info("reclaimed %s pending decisions", len(claimed), extra=self.extra)
        self._intake(claimed)
        self.trail.flush()
        return epoch

    def run(self, stop: threading.Event) -> int:
        """`start()`, then passes until `stop` (EXIT_STOPPED) or the leadership is lost (EXIT_LOST)."""
        try:
            self.start()
        except LostLeadership as exc:
            self.abandon(str(exc))
            return EXIT_LOST
        return self.serve(stop)

    def serve(self, stop: threading.Event) -> int:
        """Passes until `stop` (EXIT_STOPPED) or the leadership is lost (EXIT_LOST)."""
        try:
            while not stop.is_set():
                if not self.leadership.held():
                    raise LostLeadership("the lease is no longer held")
                try:
                    wait = self.step()
                except (redis.ConnectionError, redis.TimeoutError, kube.ApiUnavailable) as exc:
                    log.warning("pass failed, retrying: %s", exc, extra=self.extra)
                    wait = self.settings.hold_recheck_seconds
                if wait > 0:
                    self.idle(stop, wait)
        except LostLeadership as exc:
            self.abandon(str(exc))
            return EXIT_LOST
        return EXIT_STOPPED

    def idle(self, stop: threading.Event, wait: float) -> None:
        """Wait `wait` seconds, or less if a decision is appended meanwhile: a blocking XREAD of entries
        newer than the last one in the stream is the wake-up (only a hint: the fenced XREADGROUP of the
        next pass is what reads them).  A decision appended between that pass's read and this wait is
        seen at the end of the wait at worst, as with plain polling."""
        if wait < WAKE_MIN_SECONDS:
            stop.wait(wait)
            return
        deadline = time.monotonic() + wait
        # In slices of at most a second: a stop or a lost Lease is noticed within one.
        while not stop.is_set() and self.leadership.held() and (left := deadline - time.monotonic()) > 0:
            try:
                if self._wake_from is None:
                    newest = self.redis.xrevrange(self.keys.decisions, count=1)
                    self._wake_from = _stream_id(newest[0][0]) if newest else (0, 0)
                since = f"{self._wake_from[0]}-{self._wake_from[1]}"
                block = max(1, int(min(left, 1.0) * 1000))
                reply = self.redis.xread({self.keys.decisions: since}, count=1, block=block)
            except (redis.RedisError, ValueError, IndexError):
                stop.wait(left)
                return
            if reply:
                return

    def _seen(self, entries: list[Any]) -> None:
        """Remember the newest stream id read (the idle wait's starting point)."""
        for entry in entries:
            try:
                sid = _stream_id(entry[0])
            except (ValueError, IndexError, TypeError):
                continue
            if self._wake_from is None or sid > self._wake_from:
                self._wake_from = sid

    def abandon(self, why: str) -> None:
        """Leadership lost: record the refusal of every decision in hand (unacked: the next leader
        reclaims them), and stop."""
        log.error("leadership lost, stopping: %s", why, extra=self.extra)
        now = self.clock.now()
        for p in list(self.pending.values()):
            self.record(self._audit(p, Result.STALE_EPOCH, f"not released: {why}", {}, now))
        self.trail.flush_unacked()
        self.metrics.flush(self.redis, self.keys)  # releases made before the loss still count

    # -- one pass -------------------------------------------------------------------------------------

    def step(self) -> float:
        """One pass; returns how long to wait before the next one."""
        now = self.clock.now()
        self.stats.passes += 1
        self.metrics.beat()
        if now >= self._next_heartbeat:
            self.fence.heartbeat(now)
            self._next_heartbeat = now + self.settings.heartbeat_seconds
        state = read_state(self.redis, self.keys)
        if not state.ready:
            if not self._gated:
                log.info("idle: the mirror is not synced or the datastore not ready", extra=self.extra)
            self._gated = True
            return self.settings.idle_seconds
        if self._gated:  # the mirror was (re)built, maybe after Redis lost data: scan every block now
            self._next_backstop = float("-inf")
        self._gated = False
        entries = self.fence.read(self.keys.decisions, self.group, self.identity, self.settings.read_count)
        self._seen(entries)
        self._intake(entries)
        wait = self._decide(now)
        grace = self._grace(state.grace)
        if now >= self._next_cleanup:
            self._next_cleanup = now + self.settings.cleanup_interval_seconds
            if now >= self._next_backstop:
                self._next_backstop = now + self.settings.empty_block_backstop_seconds
                self.empty.backstop()
            if now >= self._next_empty:
                self._next_empty = now + self.settings.empty_block_interval_seconds
                self.empty.run(now, grace)
            self.deleted.run(now, set(self.released))
            self.cold.run(now)
        self.trail.flush()
        self.metrics.flush(self.redis, self.keys)
        self._prune(now)
        if len(entries) >= self.settings.read_count:
            return 0.0
        return min(self.settings.idle_seconds, wait, self._next_cleanup - now, self._next_heartbeat - now)

    def _grace(self, mirrored: float | None) -> float | None:
        override = self.settings.base.leak_grace_override
        return override.seconds if override is not None else mirrored

    # -- intake ---------------------------------------------------------------------------------------

    def _intake(self, entries: Iterable[Any]) -> None:
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
                log.warning("malformed decision %s acked and skipped: %s", entry, exc, extra=self.extra)
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
                self._drop(older)
            self.pending[entry] = Pending(entry, decision)
            self.by_alloc[decision.alloc_id] = entry
            handle = sanitize_handle(decision.handle)
            self.by_handle.setdefault(handle, set()).add(entry)
            self.due[handle] = float("-inf")

    def _drop(self, entry: str) -> None:
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

    def _settle(self, p: Pending, result: Result, reason: str, evidence: dict[str, Any], now: float) -> None:
        """The decision is fully handled: record it and ack it (at the next flush)."""
        self.record(self._audit(p, result, reason, evidence, now))
        self.trail.ack(p.entry)
        self._drop(p.entry)
        counter = result.value.replace("-", "_")
        if hasattr(self.stats, counter):
            setattr(self.stats, counter, getattr(self.stats, counter) + 1)

    def _note(self, p: Pending, result: Result, reason: str, evidence: dict[str, Any], now: float) -> None:
        """The decision waits: record why, once per distinct reason."""
        if p.held_reason != reason:
            p.held_reason = reason
            self.record(self._audit(p, result, reason, evidence, now))
            if result is Result.HELD_BY_HANDLE:
                self.stats.held += 1
            else:
                self.stats.errors += 1

    # -- all-or-none, re-check, release ---------------------------------------------------------------

    def _decide(self, now: float) -> float:
        """Evaluate every handle due; returns the time until the next one is due."""
        due = sorted(
            (h for h, t in self.due.items() if t <= now), key=lambda h: min(self.by_handle.get(h, {""}))
        )
        if not due:
            return self._next_due(now)
        index, mirrored = self._read_mirror(due)
        budget = self.settings.max_releases_per_pass
        ready: list[list[Pending]] = []
        for handle in due:
            group = self._evaluate(handle, index.get(handle, {}), mirrored, now)
            if not group:
                continue
            too_big = len(group) > budget and budget < self.settings.max_releases_per_pass
            if too_big or not self.bucket.take(len(group)):
                self.due[handle] = now  # next pass (rate limit or pass cap)
                continue
            budget -= len(group)
            ready.append(group)
        if ready:
            self._release(ready, mirrored, now)
        return self._next_due(now)

    def _next_due(self, now: float) -> float:
        if not self.due:
            return self.settings.idle_seconds
        soonest = min(self.due.values())
        if soonest <= now:
            return self.bucket.wait_for(1)
        return soonest - now

    def _read_mirror(
        self, handles: list[str]
    ) -> tuple[dict[str, dict[str, str]], dict[str, Allocation | None]]:
        """Handle indexes (alloc id → node attribute) and the mirrored allocations of pending decisions."""
        entries = [e for h in handles for e in sorted(self.by_handle.get(h, ()))]
        pipe = self.redis.pipeline(transaction=False)
        for h in handles:
            low, high = handle_member_range(h)
            pipe.zrange(self.keys.handles, low, high, bylex=True)
        for e in entries:
            d = self.pending[e].decision
            pipe.hget(self.keys.alloc(shard_of(d.node, self.shards)), d.alloc_id)
        replies = pipe.execute()
        index = {h: _handle_index(h, replies[i]) for i, h in enumerate(handles)}
        mirrored: dict[str, Allocation | None] = {}
        for e, raw in zip(entries, replies[len(handles) :], strict=True):
            alloc_id = self.pending[e].decision.alloc_id
            try:
                mirrored[alloc_id] = decode_allocation(alloc_id, raw) if raw is not None else None
            except RecordError as exc:
                log.warning("unreadable allocation record: %s", exc, extra={"alloc": alloc_id})
                mirrored[alloc_id] = None
        return index, mirrored

    def _evaluate(
        self, handle: str, index: dict[str, str], mirrored: dict[str, Allocation | None], now: float
    ) -> list[Pending]:
        """The handle's decisions if all-or-none allows releasing them now, else [] (held or dropped)."""
        self.due.pop(handle, None)
        group: list[Pending] = []
        unreadable: list[str] = []
        for entry in sorted(self.by_handle.get(handle, ())):
            p = self.pending[entry]
            d = p.decision
            alloc = mirrored.get(d.alloc_id)
            if alloc is None and d.alloc_id not in index:
                self._settle(p, Result.ALREADY_FREE, "the allocation is gone from the mirror", {}, now)
            elif alloc is not None and alloc.sequence_number != d.sequence_number:
                why = f"sequence number {alloc.sequence_number} since the decision ({d.sequence_number})"
                self._settle(p, Result.REFUSED_CONFLICT, why, {}, now)
            elif p.held_reason and now - d.decided_at >= self.settings.hold_expiry_seconds:
                why = "held too long: dropped (the worker decides again if it is still leaked)"
                self._settle(p, Result.HELD_BY_HANDLE, why, {}, now)
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
                self._note(p, Result.HELD_BY_HANDLE, why, {"handle_index": index}, now)
            self.due[handle] = now + self.settings.hold_recheck_seconds
            return []
        return group

    def _release(
        self, groups: list[list[Pending]], mirrored: dict[str, Allocation | None], now: float
    ) -> None:
        recheck = Rechecker(self.api, self.redis, self.keys)
        releaser = BlockReleaser(self.api, self.fence.check)
        approved: list[tuple[Pending, dict[str, Any]]] = []
        for group in groups:
            verdicts = []
            for p in group:
                alloc = mirrored.get(p.decision.alloc_id)
                assert alloc is not None  # _evaluate kept only decisions with a mirrored record
                verdicts.append((p, recheck.check(alloc)))
            handle = sanitize_handle(group[0].decision.handle)
            if any(v.valid or v.error for _, v in verdicts):
                for p, v in verdicts:
                    if v.error:
                        # Calico's allocationIsValid: a lookup that fails (not a 404) means valid, and
                        # markValid restarts the leak timer.
                        self._reset_timer(p.decision, now)
                        why = f"{v.error}: assumed in use, leak timer restarted"
                        self._settle(p, Result.REFUSED_VALID, why, {"recheck": v.evidence}, now)
                    elif v.valid:
                        self._settle(p, Result.REFUSED_VALID, v.reason, {"recheck": v.evidence}, now)
                if handle in self.by_handle:
                    self.due[handle] = now  # the rest of the handle now waits for the resurrected IP
                continue
            approved.extend((p, {"recheck": v.evidence}) for p, v in verdicts)
        approved = self._live_all_or_none(approved, releaser, now)
        if not approved:
            return
        requests = {p.entry: _request(p, mirrored[p.decision.alloc_id]) for p, _ in approved}
        evidence = {p.entry: ev for p, ev in approved}
        conflicts = releaser.conflicts(requests.values())
        if self.settings.dry_run:
            for p, ev in approved:
                why = f"would refuse: {conflicts[p.entry]}" if p.entry in conflicts else "would release"
                self._settle(p, Result.DRY_RUN, why, ev, now)
            return
        blocked: set[str] = set()
        for p, ev in approved:
            if p.entry in conflicts:
                self._settle(p, Result.REFUSED_CONFLICT, conflicts[p.entry], ev, now)
                blocked.add(sanitize_handle(p.decision.handle))
        go = [
            p
            for p, _ in approved
            if p.entry not in conflicts and sanitize_handle(p.decision.handle) not in blocked
        ]
        for p, _ in approved:
            h = sanitize_handle(p.decision.handle)
            if h in blocked and p.entry in self.pending:
                self.due[h] = now  # re-evaluated: the conflicting IP's new state decides for the rest
        if go:
            try:  # the cooldown the library would read for this `ReleaseIPs` (or the mirrored, if longer)
                watched = mirrored_cooldown(self.redis, self.keys)
                releaser.cooldown = effective_cooldown(self.api, watched)
                releaser.now = now
            except kube.KubeError as exc:
                for p in go:
                    self._note(p, Result.ERROR, f"IPAM config not readable: {exc}", evidence[p.entry], now)
                    self.due[sanitize_handle(p.decision.handle)] = now + self.settings.hold_recheck_seconds
                return
        outcomes = releaser.release(requests[p.entry] for p in go)
        for p in go:
            out = outcomes[p.entry]
            if out.result is Result.ERROR:
                self._note(p, Result.ERROR, out.reason, evidence[p.entry], now)
                self.due[sanitize_handle(p.decision.handle)] = now + self.settings.hold_recheck_seconds
                continue
            if out.result in (Result.RELEASED, Result.ALREADY_FREE):
                self.released[p.decision.alloc_id] = now
            log.info(
                "%s %s: %s",
                out.result,
                p.decision.ip,
                out.reason,
                extra={
                    **self.extra,
                    "node": p.decision.node,
                    "handle": p.decision.handle,
                    "block": p.decision.block,
                },
            )
            self._settle(p, out.result, out.reason, evidence[p.entry], now)

    def _reset_timer(self, d: Decision, now: float) -> None:
        """The worker's candidate timer and decided mark of `d` cleared (fenced), and the allocation due
        again after `hold_recheck_seconds`: the worker re-validates it then and, if it is still invalid,
        starts a new grace period (a gone node's leak is decided again at once)."""
        if self.settings.dry_run:
            return
        s = shard_of(d.node, self.shards)
        self.fence.write("HDEL", self.keys.cand(s), d.alloc_id)
        self.fence.write("HDEL", self.keys.decided(s), d.alloc_id)
        self.fence.write("ZADD", self.keys.due(s), repr(now + self.settings.hold_recheck_seconds), d.alloc_id)

    def _live_all_or_none(
        self, approved: list[tuple[Pending, dict[str, Any]]], releaser: BlockReleaser, now: float
    ) -> list[tuple[Pending, dict[str, Any]]]:
        """Handle all-or-none once more on the live blocks (the handle index is Redis's, and Redis is not
        trusted with a release): a handle whose live blocks hold an IP without a decision here waits."""
        by_handle: dict[str, list[tuple[Pending, dict[str, Any]]]] = {}
        for item in approved:
            by_handle.setdefault(sanitize_handle(item[0].decision.handle), []).append(item)
        kept: list[tuple[Pending, dict[str, Any]]] = []
        for handle, items in by_handle.items():
            try:
                others = releaser.handle_others(handle, {p.decision.ip for p, _ in items})
            except (kube.KubeError, MalformedObject) as exc:
                for p, ev in items:
                    self._note(p, Result.ERROR, f"handle not readable: {exc}", ev, now)
                self.due[handle] = now + self.settings.hold_recheck_seconds
                continue
            if others:
                why = f"the live blocks hold {len(others)} other IP(s) of the handle: {', '.join(others[:5])}"
                for p, ev in items:
                    self._note(p, Result.HELD_BY_HANDLE, why, ev, now)
                self.due[handle] = now + self.settings.hold_recheck_seconds
                continue
            kept.extend(items)
        return kept

    # -- records --------------------------------------------------------------------------------------

    def _audit(
        self, p: Pending, result: Result, reason: str, evidence: dict[str, Any], now: float
    ) -> AuditRecord:
        """`evidence`: what this leader saw (`recheck`, `handle_index`), beside the decision's own."""
        return decision_record(p.entry, p.decision, result, reason, evidence, now)

    def record(self, rec: AuditRecord) -> None:
        """Queue an audit record (written, with the acks of the pass, by `trail.flush()`)."""
        self.trail.record(rec)
        self.metrics.outcome(rec)

    def _prune(self, now: float) -> None:
        horizon = now - 2 * REDECIDE_AFTER_SECONDS
        for alloc_id in [a for a, t in self.released.items() if t < horizon]:
            del self.released[alloc_id]


def _request(p: Pending, alloc: Allocation | None) -> Request:
    d = p.decision
    attrs = dict(alloc.attrs) if alloc is not None else None
    return Request(p.entry, d.ip, d.handle, d.sequence_number, d.block, attrs)


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


# -- the process ----------------------------------------------------------------------------------------


def run_leader(
    settings: Settings | LeaderSettings, stop: threading.Event, *, metrics: LeaderMetrics | None = None
) -> int:
    """Stand by, lead once elected, and return: EXIT_STOPPED when `stop` is set, EXIT_LOST when the
    leadership is lost (restart as a standby).  In-process use (`ipamgc up`) runs this in a thread.
    `metrics`: what `ipamgc lead` serves on `/metrics` and reports in its heartbeat."""
    ls = LeaderSettings.of(settings)
    metrics = metrics if metrics is not None else LeaderMetrics()
    identity = ls.identity or ls.base.election_identity or default_identity()
    client = redis_client(ls.base.redis_url)
    api_client = kube.api_client(
        ls.base.kubeconfig, ls.base.kube_context, user_agent=f"ipamgc-leader/{identity}"
    )
    halt = threading.Event()
    leadership = Leadership(identity)
    metrics.candidate(leadership)
    candidate = kube.lease_candidate(
        api_client,
        namespace=ls.namespace,
        name=ls.lease_name,
        identity=identity,
        lease_seconds=ls.base.election_lease_seconds,
    )
    elector = Elector(
        candidate,
        leadership,
        renew_seconds=ls.base.election_renew_seconds,
        retry_seconds=ls.base.election_retry_seconds,
        lease=f"{ls.namespace}/{ls.lease_name}",
    )
    thread = threading.Thread(target=elector.run, args=(halt,), name=f"lease-{identity}", daemon=True)
    thread.start()
    code = EXIT_STOPPED
    try:
        while not leadership.leading.is_set():
            if not thread.is_alive():
                log.error("the election stopped before leading", extra={"identity": identity})
                return EXIT_LOST
            if stop.wait(0.05):
                return EXIT_STOPPED
            metrics.beat()
        api = kube.CalicoApi(api_client, calico=ls.base.calico_api_group)
        leader = Leader(ls, client, api, leadership, metrics=metrics)
        code = leader.run(stop)
        return code
    finally:
        halt.set()
        thread.join()
        if code == EXIT_STOPPED and leadership.held():
            candidate.release()
        api_client.close()  # type: ignore[no-untyped-call]
        client.close()


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
