"""The leader's live release: the last checks against the API, then the writes.

Its own module because it is the only part of a pass that trusts nothing in Redis: what the handle gate
(`workers.leader.gate`) lets through is re-checked live (`workers.leader.recheck`; valid now, or the API could
not answer ⇒ refused, the worker's leak timer restarted, as Calico's `markValid`), handle all-or-none is
checked once more on the live IPAMHandle and blocks, the live blocks must accept each request (sequence
number, handle and the attributes decided on), and only then are the blocks written, per block, under
the fence (`workers.leader.release`).  A dry run stops before the writes and records what it would have done.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import redis

from kubeio.errors import KubeError
from shared.errors import MalformedObject
from shared.gcrecords import Decision
from shared.keys import REDECIDE_AFTER_SECONDS, Keys
from shared.model import Allocation, sanitize_handle
from shared.shard import shard_of
from workers.common import wakeups
from workers.leader.audit import Result
from workers.leader.calico_objects import ObjectApi
from workers.leader.cooldown import effective_cooldown, mirrored_cooldown
from workers.leader.election import Fence
from workers.leader.ledger import Ledger, Pending
from workers.leader.recheck import Rechecker
from workers.leader.release import BlockReleaser, Request
from workers.leader.settings import LeaderSettings

log = logging.getLogger("workers.leader_release")  # its pre-split name (#37): log lines unchanged


class LiveRelease:
    """Releases the groups the gate approved (`release`), and remembers what it released (`released`:
    alloc id → when) for the deleted-node cleanup, which must not count those IPs as still in use."""

    def __init__(
        self,
        settings: LeaderSettings,
        client: redis.Redis,
        keys: Keys,
        api: ObjectApi,
        fence: Fence,
        shards: int,
        ledger: Ledger,
        extra: Callable[[], dict[str, Any]],
    ) -> None:
        self.settings = settings
        self.redis = client
        self.keys = keys
        self.api = api
        self.fence = fence
        self.shards = shards
        self.ledger = ledger
        self.extra = extra
        self.released: dict[str, float] = {}  # alloc id → when this leader released it

    def release(
        self, groups: list[list[Pending]], mirrored: dict[str, Allocation | None], now: float
    ) -> None:
        """Re-check, check and release `groups` (one per handle, from the gate); each decision is settled
        or noted, and a handle that must be looked at again is made due."""
        recheck = Rechecker(self.api, self.redis, self.keys)
        releaser = BlockReleaser(self.api, self.fence.check)
        approved: list[tuple[Pending, dict[str, Any]]] = []
        for group in groups:
            verdicts = []
            for p in group:
                alloc = mirrored.get(p.decision.alloc_id)
                assert alloc is not None  # the gate kept only decisions with a mirrored record
                verdicts.append((p, recheck.check(alloc)))
            handle = sanitize_handle(group[0].decision.handle)
            if any(v.valid or v.error for _, v in verdicts):
                for p, v in verdicts:
                    # Calico's `garbageCollectKnownLeaks`: an IP its final re-check finds valid is
                    # `markValid`ed (a lookup that fails, not a 404, counts as valid): its leak timer
                    # restarts, so it must be invalid for a whole grace period again.
                    if v.error:
                        self._reset_timer(p.decision, now)
                        why = f"{v.error}: assumed in use, leak timer restarted"
                        self.ledger.settle(p, Result.REFUSED_VALID, why, {"recheck": v.evidence}, now)
                    elif v.valid:
                        self._reset_timer(p.decision, now)
                        self.ledger.settle(p, Result.REFUSED_VALID, v.reason, {"recheck": v.evidence}, now)
                if handle in self.ledger.by_handle:
                    self.ledger.due[handle] = now  # the rest of the handle now waits for the resurrected IP
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
                self.ledger.settle(p, Result.DRY_RUN, why, ev, now)
            return
        blocked: set[str] = set()
        for p, ev in approved:
            if p.entry in conflicts:
                self.ledger.settle(p, Result.REFUSED_CONFLICT, conflicts[p.entry], ev, now)
                blocked.add(sanitize_handle(p.decision.handle))
        go = [
            p
            for p, _ in approved
            if p.entry not in conflicts and sanitize_handle(p.decision.handle) not in blocked
        ]
        for p, _ in approved:
            h = sanitize_handle(p.decision.handle)
            if h in blocked and p.entry in self.ledger.pending:
                self.ledger.due[h] = now  # re-evaluated: the conflicting IP's new state decides for the rest
        if go:
            try:  # the cooldown the library would read for this `ReleaseIPs` (or the mirrored, if longer)
                watched = mirrored_cooldown(self.redis, self.keys)
                releaser.cooldown = effective_cooldown(self.api, watched)
                releaser.now = now
            except KubeError as exc:
                for p in go:
                    self.ledger.note(
                        p, Result.ERROR, f"IPAM config not readable: {exc}", evidence[p.entry], now
                    )
                    self.ledger.due[sanitize_handle(p.decision.handle)] = (
                        now + self.settings.hold_recheck_seconds
                    )
                return
        outcomes = releaser.release(requests[p.entry] for p in go)
        for p in go:
            out = outcomes[p.entry]
            if out.result is Result.ERROR:
                self.ledger.note(p, Result.ERROR, out.reason, evidence[p.entry], now)
                self.ledger.due[sanitize_handle(p.decision.handle)] = now + self.settings.hold_recheck_seconds
                continue
            if out.result in (Result.RELEASED, Result.ALREADY_FREE):
                self.released[p.decision.alloc_id] = now
            log.info(
                "%s %s: %s",
                out.result,
                p.decision.ip,
                out.reason,
                extra={
                    **self.extra(),
                    "node": p.decision.node,
                    "handle": p.decision.handle,
                    "block": p.decision.block,
                },
            )
            self.ledger.settle(p, out.result, out.reason, evidence[p.entry], now)

    def _reset_timer(self, d: Decision, now: float) -> None:
        """The worker's candidate timer cleared too (`redecide`): if the allocation is still invalid when
        the worker re-validates it, a new grace period starts (a gone node's leak is decided again at
        once)."""
        self.redecide(d, now, restart_timer=True)

    def redecide(self, d: Decision, now: float, *, restart_timer: bool = False) -> None:
        """The worker's decided mark of `d` cleared (fenced), and the allocation due again after
        `hold_recheck_seconds`: the worker re-validates it then, and emits a decision again if it is still
        a confirmed leak.  For every decision dropped on what the mirror said (gone, another sequence
        number, held too long): the worker's mark would otherwise keep it from deciding again until the
        mark is `REDECIDE_AFTER_SECONDS` old *and* something makes it look (a change, the periodic
        resync), and a mirror caught mid-rebuild would leave a leak for that long.  The candidate timer
        stays unless `restart_timer`: the grace period already ran."""
        if self.settings.dry_run:
            return
        s = shard_of(d.node, self.shards)
        if restart_timer:
            self.fence.write("HDEL", self.keys.cand(s), d.alloc_id)
        self.fence.write("HDEL", self.keys.decided(s), d.alloc_id)
        due = now + self.settings.hold_recheck_seconds
        self.fence.write("ZADD", self.keys.due(s), repr(due), d.alloc_id)
        wakeups.offer(self.redis, self.keys, (due,))

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
            except (KubeError, MalformedObject) as exc:
                for p, ev in items:
                    self.ledger.note(p, Result.ERROR, f"handle not readable: {exc}", ev, now)
                self.ledger.due[handle] = now + self.settings.hold_recheck_seconds
                continue
            if others:
                why = f"the live blocks hold {len(others)} other IP(s) of the handle: {', '.join(others[:5])}"
                for p, ev in items:
                    self.ledger.note(p, Result.HELD_BY_HANDLE, why, ev, now)
                self.ledger.due[handle] = now + self.settings.hold_recheck_seconds
                continue
            kept.extend(items)
        return kept

    def prune(self, now: float) -> None:
        """Forget releases older than twice the re-decide period."""
        horizon = now - 2 * REDECIDE_AFTER_SECONDS
        for alloc_id in [a for a, t in self.released.items() if t < horizon]:
            del self.released[alloc_id]


def _request(p: Pending, alloc: Allocation | None) -> Request:
    d = p.decision
    attrs = dict(alloc.attrs) if alloc is not None else None
    return Request(p.entry, d.ip, d.handle, d.sequence_number, d.block, attrs)
