"""The leader: the one writer.  It releases confirmed leaks safely and cleans empty blocks and deleted nodes.

One pass (`Leader.step`), under a fencing epoch (`workers.leader.election`):
1. read new decisions from the `decisions` stream through a consumer group (fenced XREADGROUP; after an
   election every pending entry of every consumer is reclaimed with XAUTOCLAIM); a malformed entry is
   logged, counted, recorded and acked, never released;
2. collect decisions per (sanitised) handle and enforce handle all-or-none across shards: a handle's IPs
   go only when every allocation the handle index (`P:handles`) lists for it has a pending decision that
   still matches the mirror (sequence number); otherwise they wait, re-evaluated on each new decision for
   the handle and every `hold_recheck_seconds` (never spinning), and are dropped once older than the
   worker's re-decide period; a decision dropped on the mirror's word (gone, another sequence number,
   held too long) goes back to its worker, due again `hold_recheck_seconds` later, which sends a fresh
   one if the leak persists;
3. re-check each allocation against the live API right before releasing (spec §3.9,
   `workers.leader.recheck.Rechecker`);
   valid now, or the API could not answer (Calico: valid, timer restarted) ⇒ the decision is dropped
   (`refused-valid`); a live node's leak whose timer started before the grace period last changed is
   dropped too (`refused-conflict`), and decided again on a timer that counts from the change;
4. release per block with (ip, handle, sequence number) (`workers.leader.release`), at most
   `max_releases_per_pass` IPs a pass and `rate_limit` a second; a conflict drops the decision;
5. every few seconds, deleted nodes and empty blocks (`workers.leader.cleanup`,
   `workers.leader.empty_blocks`), and a backstop scan of every block record every
   `empty_block_backstop_seconds`;
6. leaked and divergent IPAMHandles (`workers.leader.handle_gc`, docs/handles.md): a scan every
   `handle_gc_interval_seconds`, repairs of what is due (IPAMHandle writes only) within the rate limit.
Each decision is acked only once fully handled (released, already free, refused or superseded), in the
same fenced script that appends its audit record.  Losing the Lease or the epoch stops the pass at the
next write; `run()` then returns `EXIT_LOST` and the supervisor restarts the process as a standby.

The pass composes its parts, one module each: the ledger of pending decisions (`workers.leader.ledger`:
1, and every settle/ack), the handle gate on the mirror (`workers.leader.gate`: 2, the pass cap and the
rate limit), the live release (`workers.leader.live_release`: 3–4), the cleanup passes (5), the fence and the
audit trail (`workers.leader.election`, `workers.leader.audit`) and the idle wait (`workers.leader.wake`).
What stays here is the term (start, serve, abandon), the pass and its schedule, and the process
(`run_leader`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
from redis.exceptions import OutOfMemoryError

from kubeio import client as kubeio_client
from kubeio.election import Elector, Leadership, default_identity
from kubeio.errors import ApiUnavailable
from redisio.client import redis_client
from shared.clock import Clock, ServerClock
from shared.config import Settings
from shared.keys import Keys
from workers.common.redis_state import read_state
from workers.leader import kube
from workers.leader.audit import AuditRecord, AuditTrail, Result
from workers.leader.calico_objects import ObjectApi
from workers.leader.cleanup import Context, DeletedNodes
from workers.leader.cooldown import ColdIPs, read_ipam_config
from workers.leader.election import Fence, LostLeadership
from workers.leader.empty_blocks import EmptyBlocks
from workers.leader.gate import HandleGate
from workers.leader.handle_gc import HandleCollector
from workers.leader.ledger import Ledger
from workers.leader.live_release import LiveRelease
from workers.leader.metrics import LeaderMetrics
from workers.leader.rate_limit import TokenBucket
from workers.leader.settings import LeaderSettings
from workers.leader.wake import DecisionWake

log = logging.getLogger("workers.leader")  # its pre-split name (#37): log lines unchanged

EXIT_STOPPED = 0  # asked to stop
EXIT_CONFIG = 2  # bad settings
EXIT_LOST = 3  # lost the Lease or the epoch: restart as a standby
GROUP = "leader"
# After a pass that released IPs, the deleted nodes' affinities are looked at again this soon at most.
DELETED_NODES_SOON_SECONDS = 1.0
DRY_RUN_GROUP = "leader-dry-run"  # a dry run never consumes the real leader's decisions


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
        self.trail = AuditTrail(self.fence, self.keys, self.group, self.clock.now)
        self.trail.on_lost = self.metrics.audit_lost.inc
        self.ledger = Ledger(self.trail, self.record, lambda: self.extra)
        self.stats = self.ledger.stats
        bucket = TokenBucket(settings.rate_limit, monotonic=monotonic)
        node_bucket = TokenBucket(settings.deleted_node_rate_limit, monotonic=monotonic)
        self.live = LiveRelease(
            settings, client, self.keys, api, self.fence, self.shards, self.ledger, lambda: self.extra
        )
        self.gate = HandleGate(
            settings, client, self.keys, self.shards, self.ledger, bucket, self.live.redecide, node_bucket
        )
        self.wake = DecisionWake(client, self.keys)
        self._next_cleanup = float("-inf")
        self._next_deleted = float("-inf")
        self._next_empty = float("-inf")
        self._next_backstop = float("-inf")  # the first pass of a term scans: unindexed blocks, orphans
        self._next_heartbeat = float("-inf")
        self._active_until = float("-inf")  # until when the cleanup passes run at the active interval
        self._gated = False
        ctx = Context(
            client,
            self.keys,
            api,
            self.fence.check,
            self.fence.write,
            self.shards,
            settings.dry_run,
            self.record,
            lambda: read_ipam_config(api).ip_cooldown_seconds,
        )
        self.deleted = DeletedNodes(ctx)
        self.handles = HandleCollector(  # leaked IPAMHandles (docs/handles.md); IPAMHandle writes only
            settings,
            api,
            client,
            self.keys,
            guard=self.fence.check,
            record=self.trail.record,
            bucket=bucket,
            metrics=self.metrics.handle_gc,
            extra=lambda: self.extra,
        )
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
        self.ledger.intake(claimed)
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
                except (redis.ConnectionError, redis.TimeoutError, OutOfMemoryError, ApiUnavailable) as exc:
                    # OOM: a Redis at its maxmemory (`noeviction`) refuses the pass's writes until room is
                    # made; what the pass did is recorded in the log lines, its decisions stay unacked.
                    log.warning("pass failed, retrying: %s", exc, extra=self.extra)
                    wait = self.settings.hold_recheck_seconds
                if wait > 0:
                    self.idle(stop, wait)
        except LostLeadership as exc:
            self.abandon(str(exc))
            return EXIT_LOST
        return EXIT_STOPPED

    def idle(self, stop: threading.Event, wait: float) -> None:
        """Wait `wait` seconds, or less if a decision is appended meanwhile (`DecisionWake.wait`)."""
        self.wake.wait(stop, wait, self.leadership.held)

    def abandon(self, why: str) -> None:
        """Leadership lost: record the refusal of every decision in hand (unacked: the next leader
        reclaims them), and stop."""
        log.error("leadership lost, stopping: %s", why, extra=self.extra)
        now = self.clock.now()
        for p in list(self.ledger.pending.values()):
            self.record(self.ledger.audit(p, Result.STALE_EPOCH, f"not released: {why}", {}, now))
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
            return self.settings.gated_seconds
        if self._gated:  # the mirror was (re)built, maybe after Redis lost data: scan every block now
            self._next_backstop = float("-inf")
        self._gated = False
        entries = self.fence.read(self.keys.decisions, self.group, self.identity, self.settings.read_count)
        self.wake.seen(entries)
        self.ledger.intake(entries)
        released = len(self.live.released)
        wait = self._decide(now, state.grace_since)
        released_now = len(self.live.released) > released
        grace = self._grace(state.grace)
        if entries or self.ledger.pending:  # active: the cleanup passes come at the shorter interval
            self._active_until = now + self.settings.active_seconds
            self._next_cleanup = min(self._next_cleanup, now + self.settings.cleanup_interval_seconds)
        if now >= self._next_cleanup:
            self._next_cleanup = now + self._cleanup_interval(now)
            if now >= self._next_backstop:
                self._next_backstop = now + self.settings.empty_block_backstop_seconds
                self.empty.backstop()
            if now >= self._next_empty:
                self._next_empty = now + self.settings.empty_block_interval_seconds
                self.empty.run(now, grace, state.grace_since)
            self.deleted.run(now, self.live.released)
            self._next_deleted = now + DELETED_NODES_SOON_SECONDS
            self.cold.run(now)
        elif released_now and now >= self._next_deleted:
            # IPs were released: maybe a deleted node's last ones.  Its affinities go now, as Calico's go
            # in the pass that released its IPs, not at the next cleanup pass (up to 5 s later, 30 s on a
            # quiet cluster); at most once a second (hundreds of deleted nodes may be waiting at once).
            self._next_deleted = now + DELETED_NODES_SOON_SECONDS
            self.deleted.run(now, self.live.released)
        handles_wait = self.handles.run(now, grace)
        self.trail.flush()
        self.metrics.flush(self.redis, self.keys)
        self.live.prune(now)
        if len(entries) >= self.settings.read_count:
            return 0.0
        return min(
            self.settings.idle_seconds,
            wait,
            self._next_cleanup - now,
            self._next_heartbeat - now,
            handles_wait,
        )

    def _cleanup_interval(self, now: float) -> float:
        """Seconds to the next cleanup pass: `cleanup_interval_seconds` while decisions come (and for
        `active_seconds` after the last), `idle_cleanup_interval_seconds` on a quiet cluster."""
        if now < self._active_until:
            return self.settings.cleanup_interval_seconds
        return max(self.settings.cleanup_interval_seconds, self.settings.idle_cleanup_interval_seconds)

    def _grace(self, mirrored: float | None) -> float | None:
        override = self.settings.base.leak_grace_override
        return override.seconds if override is not None else mirrored

    def _decide(self, now: float, grace_since: float = 0.0) -> float:
        """Evaluate every handle due and release what may go; returns the time until the next one is due.
        `grace_since`: when the grace period last changed (a live node's leak decided on a timer started
        before it is dropped: Calico's restart forgets its confirmed leaks)."""
        ready, mirrored = self.gate.ready(now, grace_since)
        if ready:
            self.live.release(ready, mirrored, now)
        return self.gate.next_due(now)

    # -- records --------------------------------------------------------------------------------------

    def record(self, rec: AuditRecord) -> None:
        """Queue an audit record (written, with the acks of the pass, by `trail.flush()`)."""
        self.trail.record(rec)
        self.metrics.outcome(rec)


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
    api_client = kubeio_client.api_client(
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
        api_client.close()
        client.close()
