"""The leader's settings: `ipamgc lead`'s options on top of the shared ones.

Its own module because every part of the leader reads them — the pass (`workers.leader.loop`), the handle gate
(`workers.leader.gate`), the live release (`workers.leader.live_release`) — while none of those parts should
import the `Leader` that composes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.config import Settings
from shared.keys import REDECIDE_AFTER_SECONDS


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
    # IP releases per second of deleted nodes (a bucket of their own; 0: unlimited).  A deleted node's IPs
    # are the least ambiguous release there is (the node and the pod gone, both re-read live), and they
    # come in waves under autoscaler churn: 100 of 250 nodes every 15 minutes (#7839) is ~3 IPs/s on
    # average but 30-110 at once per node; half of 400 nodes every 10 minutes with 25 pods each, ~8.
    # Calico releases them with no limit but its client's.  At the shared 50/s the benchmark's compressed
    # harder churn (×10: ~70 IPs/s) waited minutes; at 150/s its last node was freed 7.9 s after its
    # deletion over two periods (docs/benchmarks.md, "Node churn and conflicts").
    deleted_node_rate_limit: float = 150.0
    # Calico's `maxBatchSize`: at most this many IPs released per pass.
    max_releases_per_pass: int = 10_000
    # Decisions read per XREADGROUP; a full read means more are waiting (no idle wait then).
    read_count: int = 1000
    # Seconds between passes when there is nothing to read.  The wait ends early when a decision arrives
    # (a blocking XREAD on the stream, `Leader.idle`), and no later than the next cleanup pass or
    # heartbeat, so this bounds only the cost of an idle leader, not the latency of a release.  At one
    # pass a second the whole idle leader took 1.7 ms of CPU a second in `ipamgc bench`'s idle phase
    # (its Lease renewals included); with this and the watcher's one-round-trip kick, the idle phase's
    # Redis commands fell from 29.8 to 25.7 a second.  10 s since the idle floor's work (2026-12-04): an
    # idle pass is three round trips (estimated well under 0.1 ms of CPU a second at this period), and
    # decisions end the wait anyway; this bounds how late a wake-up the blocking read missed is noticed.
    idle_seconds: float = 10.0
    # Seconds before a leader whose mirror is not synced (or whose datastore is not ready) looks again.
    gated_seconds: float = 5.0
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
    # While no decision has come for `active_seconds`, the cleanup passes run this far apart instead: a quiet
    # cluster's deleted nodes and empty blocks wait at most this long (after the empty-block grace period,
    # 15 minutes in production), and an idle leader makes a pass every 30 s, not every 5 (docs/benchmarks.md,
    # "Cost by event rate").  A node deletion makes decisions, which make the leader active again at once.
    idle_cleanup_interval_seconds: float = 30.0
    active_seconds: float = 60.0
    # Seconds between backstop scans of every block record (~0.4 CPU s at 5,000 blocks / 150,000
    # allocations): orphaned host blocks whose node delete was missed, and empty blocks missing from the
    # index.  Both need data loss or a watcher bug, and the watcher relists every 5 minutes by default
    # (its resync period without a grace period), so that is the backstop's period too: ~0.1% of a core.
    # A leader also scans on its term's first pass and when the mirror is rebuilt (not synced → synced:
    # Redis lost data), when orphans are likeliest.
    empty_block_backstop_seconds: float = 300.0
    # Seconds between the fence's `heartbeat` writes (read by `ipamgc status` only, as an age): part of the
    # idle floor, so no more often than the process's own heartbeat.
    heartbeat_seconds: float = 30.0
    # The handle collector (docs/handles.md, `workers.leader.handle_gc`): on unless `--no-handle-gc`
    # (IPAMGC_NO_HANDLE_GC).  A scan lists every IPAMHandle in pages of `handle_gc_page` and every IPAMBlock
    # in pages 16 times smaller (`workers.leader.handle_scan`):
    # 0.5-0.8 s of CPU at 10k pods (10,100 handles, half of it decoding the JSON), 2.2 s with 30k leaked
    # handles more (`ipamgc bench --leaked-handles`, docs/handles.md).  One every 5 minutes (the watcher's
    # relist period) is ~0.2% of a core, and delays nothing: with Calico's 15 minute grace period the 4th
    # scan is the first that may repair anyway.
    handle_gc: bool = True
    handle_gc_interval_seconds: float = 300.0
    # At most this share of a core for scans while the last scan found divergent handles: the next scan
    # waits at least the last one's CPU time divided by it: every 5 minutes up to ~20k handles.
    handle_gc_max_cpu_share: float = 0.005
    # … and this share when it found none, the steady state of most clusters, where the scans are the
    # collector's whole cost and would otherwise be most of the leader's idle floor (a scan took 0.5–0.8 s
    # of CPU at 10k pods, 4.3 s at 150k: every 5 minutes that was 2–3 ms of CPU a second at 10k, against an
    # idle floor of ~1 ms/s for all of ipamgc; docs/benchmarks.md, "Cost by event rate").  0.02% of a core
    # (0.2 ms of CPU a second on average): a quiet 10k cluster is scanned every ~50 minutes, a 150k one
    # every ~6 hours; a new leak is found that much later, then repaired at the faster pace.
    handle_gc_quiet_cpu_share: float = 0.0002
    handle_gc_page: int = 500
    # Consecutive scans that must show the same disagreement (Calico's PR #12713: 3).
    handle_gc_passes: int = 3
    # The disagreement must also have held for the leak grace period (Calico's 15m when unset), and never
    # for less than this: longer than any CNI call between its handle write and its block write (Calico's
    # IPAM plugin works under a 90 s deadline, its clean-ups under 30 s).
    handle_gc_min_grace_seconds: float = 300.0
    # Handle repairs per pass at most (each also takes one token of `rate_limit`): bounds a pass.
    handle_gc_max_per_pass: int = 500

    @property
    def namespace(self) -> str:
        return self.lease_namespace or self.base.election_namespace

    @classmethod
    def of(cls, settings: Settings | LeaderSettings) -> LeaderSettings:
        return settings if isinstance(settings, LeaderSettings) else cls(base=settings)
