"""Metrics of the leader: where each count is kept, and why there.

Counters that many processes add to live in Redis (the shard jobs' batch counters:
`workers/shards/metrics.py`, which says why).  Calico's `ipam_allocations_gc_reclamations` is kept in
Redis too (`P:reclaimed`, per block and node, HINCRBY once per leader pass): the watcher knows the
IPPools a block maps to, and the count survives a leader fail-over.

What belongs to one process stays in it: the leader's state (`is_leader`, `epoch`) and its outcomes by
result (one per audit record: `object` is `ip` for an allocation, `block` for a block or affinity) are
served by each leader replica on its own `/metrics`; a standby's are zero, so `sum()` is exact.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable

import redis
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client import Counter as PromCounter

from kubeio.election import Leadership
from shared import metrics_names as m
from shared.keys import Keys
from workers.leader.audit import AuditRecord, Result
from workers.leader.handle_metrics import HandleGcMetrics

log = logging.getLogger("workers.metrics")  # its pre-split name (#37): log lines unchanged


class LeaderMetrics:
    """The leader process's own metrics, its Redis-kept reclamations, and the progress its heartbeat
    reports.  `registry` None keeps the metrics in a private registry nobody serves (tests, `up` in
    process)."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        reg = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.registry = reg
        self.monotonic = monotonic
        self.releases = PromCounter(
            m.RELEASES,
            "The leader's outcomes (one per audit record), by result and object (ip or block).",
            ["result", "object"],
            registry=reg,
        )
        for result in Result:
            for obj in ("ip", "block"):
                self.releases.labels(result.value, obj)
        self.is_leader = Gauge(m.LEADER_IS_LEADER, "1 while this leader holds its Lease.", registry=reg)
        doc = "Fencing epoch of this leader's last term (0: never led)."
        self.epoch = Gauge(m.LEADER_EPOCH, doc, registry=reg)
        self.audit_lost = PromCounter(
            m.AUDIT_RECORDS_LOST,
            "Audit records this leader numbered that the stream no longer holds (lost from Redis; kept in "
            "the ipamgc.audit log lines).",
            registry=reg,
        )
        self.handle_gc = HandleGcMetrics(reg)  # the handle collector's (workers/leader/handle_gc.py)
        self.progress_at = monotonic()
        self._leadership: Leadership | None = None
        self._reclaimed: Counter[str] = Counter()

    # -- hooks of workers.leader.loop ---------------------------------------------------------------------

    def candidate(self, leadership: Leadership) -> None:
        """The process stands for election with `leadership`: `is_leader` follows it."""
        self._leadership = leadership
        self.is_leader.set_function(lambda: 1.0 if leadership.held() else 0.0)

    def led(self, epoch: int) -> None:
        """A term began with fencing epoch `epoch`."""
        self.epoch.set(epoch)
        self.beat()

    def beat(self) -> None:
        """The main loop came round (standby wait or a pass)."""
        self.progress_at = self.monotonic()

    def outcome(self, rec: AuditRecord) -> None:
        """One audit record: counted by result; a released IP also counts as a reclamation."""
        obj = "ip" if rec.ip else "block"
        self.releases.labels(rec.result.value, obj).inc()
        if rec.result is Result.RELEASED and rec.ip and rec.block:
            self._reclaimed[m.reclaimed_field(rec.block, rec.node)] += 1

    def flush(self, client: redis.Redis, keys: Keys) -> None:
        """Add the reclamations counted since the last flush to `P:reclaimed` (one pipeline).  On a Redis
        error they are kept for the next flush: a count is late, never lost while the process lives."""
        if not self._reclaimed:
            return
        pending = dict(self._reclaimed)
        pipe = client.pipeline(transaction=False)
        for f, n in sorted(pending.items()):
            pipe.hincrby(keys.reclaimed, f, n)
        try:
            pipe.execute()
        except redis.RedisError as exc:
            log.warning("reclamation counts not written yet: %s", exc)
            return
        self._reclaimed.subtract(pending)
        self._reclaimed = +self._reclaimed

    def health(self, stall: float = m.STALL_SECONDS) -> tuple[bool, str]:
        """(alive, state) for the heartbeat: alive while the main loop comes round."""
        alive = self.monotonic() - self.progress_at < stall
        leadership = self._leadership
        return alive, "leading" if leadership is not None and leadership.held() else "standby"
