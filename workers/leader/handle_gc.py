"""The leader's handle collector: leaked and divergent IPAMHandles repaired, once per pass at most.

Why it exists: Calico keeps an IP's allocation in the IPAMBlock and counts it per block in an IPAMHandle,
with no transaction between the two; a crash between the writes leaves them out of step, and no released
Calico collects handles (#8548: 30,000 leaked).  Calico's open PR #12713 adds a handle reconciler to its
GC; this is ipamgc's, stricter (docs/handles.md).  Every `handle_gc_interval_seconds` (longer on a big
cluster: `scan_interval`) a scan lists every handle and block (`workers.leader.handle_scan`) and records
each divergence (`shared.consistency`: orphan, skewed, missing, stuck soft-deleted) in the observation
history (`shared.handlegc.observe`).  A
divergence seen the same in `handle_gc_passes` consecutive scans *and* for the grace period is due: it is
re-read live and repaired with a conditional write (`workers.leader.handle_repair`), one token of the
leader's rate limit each, at most `handle_gc_max_per_pass` a pass, behind the fence.  Only IPAMHandles
are written: no IP is ever freed or reassigned here.

The history lives in the leader's memory: a new leader starts counting again (later, never sooner).
`Leader.step` calls `run` once a pass; it returns how soon it wants the next pass.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import redis

from kubeio.errors import KubeError
from shared.consistency import HandleClass, divergences
from shared.handlegc import Observation, observe
from shared.handletables import unsettled
from shared.keys import Keys
from workers.leader.audit import AuditRecord, Result
from workers.leader.calico_objects import ObjectApi
from workers.leader.handle_metrics import HandleGcMetrics
from workers.leader.handle_repair import Outcome, repair
from workers.leader.handle_scan import ScanIncomplete, scan
from workers.leader.rate_limit import TokenBucket
from workers.leader.settings import LeaderSettings

log = logging.getLogger("workers.handle_gc")

FOREVER = float("inf")


class HandleCollector:
    """Scans on its schedule and repairs what is due (see the module docstring)."""

    def __init__(
        self,
        settings: LeaderSettings,
        api: ObjectApi,
        client: redis.Redis,
        keys: Keys,
        *,
        guard: Callable[[], None],
        record: Callable[[AuditRecord], None],
        bucket: TokenBucket,
        metrics: HandleGcMetrics,
        extra: Callable[[], dict[str, Any]],
    ) -> None:
        self.settings = settings
        self.api = api
        self.redis = client
        self.keys = keys
        self.guard = guard  # the fence check, before every write
        self.record = record
        self.bucket = bucket
        self.metrics = metrics
        self.extra = extra
        self.history: dict[str, Observation] = {}
        self.next_scan = float("-inf")
        self.scans = 0
        self.last_scan_cpu = 0.0  # CPU seconds of the last scan (this thread's)
        self.repaired: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()
        self._summary: dict[str, str] = {}

    def grace(self, leak_grace: float | None) -> float:
        """How long a disagreement must hold: the leak grace period (Calico's default when unset), never
        less than `handle_gc_min_grace_seconds`."""
        grace = leak_grace if leak_grace is not None else self.settings.base.default_leak_grace_seconds
        return max(grace, self.settings.handle_gc_min_grace_seconds)

    def scan_interval(self) -> float:
        """`handle_gc_interval_seconds`, or longer when the last scan's CPU would be more than a share of a
        core at that period (a big cluster scans less often): `handle_gc_max_cpu_share` while the last scan
        found divergent handles (their repair waits for consecutive scans), `handle_gc_quiet_cpu_share`
        when it found none (the scans are then the whole cost of the collector)."""
        s = self.settings
        share = s.handle_gc_max_cpu_share if self.history else s.handle_gc_quiet_cpu_share
        floor = self.last_scan_cpu / share if share > 0 else 0.0
        return max(self.settings.handle_gc_interval_seconds, floor)

    def run(self, now: float, leak_grace: float | None) -> float:
        """One pass: a scan if one is due, then the due repairs the rate limit admits.  Returns the
        seconds until it wants another pass (FOREVER when switched off)."""
        if not self.settings.handle_gc:
            return FOREVER
        grace = self.grace(leak_grace)
        if now >= self.next_scan:
            cpu = time.thread_time()
            self._scan(now, grace)
            self.last_scan_cpu = time.thread_time() - cpu
            self.next_scan = now + self.scan_interval()
        left = self._repair(now, grace)
        if left:
            return self.bucket.wait_for(min(left, self.settings.handle_gc_max_per_pass))
        soonest = self.next_scan
        for obs in self.history.values():
            at = obs.due_at(grace, self.settings.handle_gc_passes)
            if at is not None and not obs.reported:
                soonest = min(soonest, at)
        return max(0.0, soonest - now)

    # -- the scan ---------------------------------------------------------------------------------------

    def _scan(self, now: float, grace: float) -> None:
        try:
            seen = scan(self.api, self.settings.handle_gc_page)
        except (ScanIncomplete, KubeError) as exc:
            # Consecutive means consecutive: a scan that judged nothing starts every count again.  A
            # refusal (403: a role without `list`) is logged at every scan, never a reason to stop leading.
            log.warning("handle scan incomplete, history reset: %s", exc, extra=self.extra())
            self.history = {}
            return
        self.scans += 1
        found = divergences(
            seen.holdings, seen.handles, seen.unreadable, unsettled(seen.handles, seen.holdings)
        )
        self.history = observe(self.history, found, now)
        counts: Counter[HandleClass] = Counter()
        for obs in self.history.values():  # a dry run's `reported` carries over while unchanged
            counts[obs.divergence.cls] += 1
            if obs.passes == 1:
                self.metrics.found.labels(obs.divergence.cls.value).inc()
        self.metrics.scanned(counts)
        log.info(
            "handle scan %s: %s handles, %s blocks, %s divergent (%s list requests)",
            self.scans,
            len(seen.handles),
            seen.blocks,
            len(found),
            seen.requests,
            extra=self.extra(),
        )
        self._summary = {
            "at": repr(now),
            "enabled": "1",
            "dry_run": "1" if self.settings.dry_run else "0",
            "handles": str(len(seen.handles)),
            "blocks": str(seen.blocks),
            "grace": repr(grace),
            **{f"divergent|{c.value}": str(counts.get(c, 0)) for c in HandleClass},
        }
        self._publish(now, grace)

    # -- the repairs ------------------------------------------------------------------------------------

    def _due(self, now: float, grace: float) -> list[Observation]:
        passes = self.settings.handle_gc_passes
        due = [o for o in self.history.values() if not o.reported and o.due(now, grace, passes)]
        return sorted(due, key=lambda o: (o.first_seen, o.divergence.name))

    def _repair(self, now: float, grace: float) -> int:
        """Repair what is due within the pass cap and the rate limit; returns how many are still due."""
        due = self._due(now, grace)
        done = 0
        for obs in due:
            if done >= self.settings.handle_gc_max_per_pass or not self.bucket.take(1):
                break
            done += 1
            try:
                outcome = repair(self.api, obs, self.guard, self.settings.dry_run)
            except KubeError as exc:  # unavailable, refused (403), …: nothing written, counted
                outcome = Outcome(Result.ERROR, f"API error, nothing written: {exc}")
            self._settle(obs, outcome, now, grace)
        if done:
            self._publish(now, grace)
        return len(due) - done

    def _settle(self, obs: Observation, outcome: Outcome, now: float, grace: float) -> None:
        d = obs.divergence
        cls = d.cls.value
        if outcome.result is Result.DRY_RUN:
            self.history[d.name] = Observation(d, obs.signature, obs.first_seen, obs.passes, reported=True)
        else:
            # Repaired or refused: observed afresh from the next scan (a repair's effect included).
            self.history.pop(d.name, None)
        if outcome.result in (Result.REPAIRED, Result.DRY_RUN):
            action = outcome.action.value if outcome.action is not None else ""
            self.metrics.repaired.labels(cls, action).inc()
            self.repaired[cls] += 1
        else:
            reason = "conflict" if outcome.result is Result.REFUSED_CONFLICT else "error"
            self.metrics.refused.labels(cls, reason).inc()
            self.refused[cls] += 1
        evidence = {
            "handle_gc": {
                "class": cls,
                "action": outcome.action.value if outcome.action is not None else "",
                "first_seen": obs.first_seen,
                "passes": obs.passes,
                "grace": grace,
                "held_for": now - obs.first_seen,
                "observed": {
                    "handle_resource_version": d.resource_version or "absent",
                    "recorded": dict(d.recorded),
                    "deleted": d.deleted,
                    "held": dict(d.held),
                },
                "live": dict(outcome.live),
            }
        }
        self.record(
            AuditRecord(
                result=outcome.result,
                handle=d.handle_id,
                rule=f"handle-{cls}",
                reason=outcome.reason,
                evidence=evidence,
                at=now,
            )
        )
        level = logging.INFO if outcome.result in (Result.REPAIRED, Result.DRY_RUN) else logging.WARNING
        log.log(
            level,
            "handle %s (%s): %s: %s",
            d.name,
            cls,
            outcome.result.value,
            outcome.reason,
            extra={**self.extra(), "handle": d.handle_id},
        )

    def _publish(self, now: float, grace: float) -> None:
        """`P:handlegc` for `ipamgc status` (best effort: a status line is never worth a failed pass)."""
        passes = self.settings.handle_gc_passes
        due: Counter[str] = Counter(o.divergence.cls.value for o in self._due(now, grace))
        fields: dict[Any, str] = {  # Any: redis-py's invariant key type
            **self._summary,
            **{f"due|{c.value}": str(due.get(c.value, 0)) for c in HandleClass},
            **{f"repaired|{c.value}": str(self.repaired.get(c.value, 0)) for c in HandleClass},
            **{f"refused|{c.value}": str(self.refused.get(c.value, 0)) for c in HandleClass},
            "passes": str(passes),
        }
        try:
            self.redis.hset(self.keys.handle_gc, mapping=fields)
        except redis.RedisError as exc:
            log.warning("handle collector summary not written: %s", exc, extra=self.extra())
