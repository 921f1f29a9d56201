"""The names of every Prometheus metric ipamgc exposes, in one place, with who exposes it and how.

Dashboards and alerts are written against these names (deploy/grafana/ipamgc-dashboard.json is checked
against them by a test), and Calico's own (spec §7) are kept exactly, so that dashboards and alerts
written for calico-kube-controllers keep working.  Every process serves `/metrics` on port 9094 (Calico's,
`--metrics-port`, 0 disables).  Where a value lives, and so which process exposes it:

| metric | type | labels | exposed by | computed |
| --- | --- | --- | --- | --- |
| `ipam_allocations_in_use` | gauge | ippool, node | active watcher | incrementally, as blocks mirror |
| `ipam_allocations_borrowed` | gauge | ippool, node | active watcher | incrementally, as blocks mirror |
| `ipam_blocks` | gauge | ippool, node | active watcher | incrementally, as blocks mirror |
| `ipam_allocations_gc_candidates` | gauge | ippool, node | active watcher | every refresh, from `cand:{s}` |
| `ipam_allocations_gc_reclamations` | counter* | ippool, node | active watcher | leader HINCRBYs, in Redis |
| `ipam_ippool_size` | gauge | ippool | active watcher | IPPools listed every refresh |
| `ipam_ippool_reserved` | gauge | ippool | active watcher | IPReservations listed every refresh |
| `ipam_{allocations,allocations_borrowed,blocks}_per_node` | gauge | node | active watcher | legacy: sums |
| `ipamgc_watch_*_total` | counter | kind | watcher | its reflectors' counts |
| `ipamgc_shard_{dirty,inflight,candidates,due,revalidating}` | gauge | shard | active watcher | refresh |
| `ipamgc_redis_{used_memory,maxmemory}_bytes` | gauge | — | active watcher | every refresh, `INFO memory` |
| `ipamgc_validation_batch_seconds` | histogram | — | active watcher | workers HINCRBY, in Redis |
| `ipamgc_decisions_total` | counter | reason | active watcher | workers HINCRBY, in Redis |
| `ipamgc_releases_total` | counter | result, object | leader | its audit records |
| `ipamgc_leader_is_leader`, `ipamgc_leader_epoch` | gauge | — | leader | its Lease and fence |
| `rest_client_requests_total` | counter | verb, resource, code | watcher, leader | each API request |
| `rest_client_request_duration_seconds` | histogram | verb, resource | watcher, leader | each API request |
| `ipamgc_handle_gc_divergent` | gauge | class | leader | its handle collector's last scan |
| `ipamgc_handle_gc_{found,repaired,refused}_total` | counter | class, action/reason | leader | handle GC |

The legacy per-node series are the sums over pools of the three per-(pool, node) gauges above, at scrape
(producer/pool_metrics.py says exactly how each follows Calico).

(*) Calico's Go client exposes this counter without a `_total` suffix; prometheus_client always adds one
to counters, so it is exposed untyped under Calico's exact name (`rate()` works the same).

Calico's gauges follow §7: an allocation (an ordinal with a handle) counts in the pool whose CIDR
contains its block (`no_ippool` when none does, a pool being deleted counts as gone) under its `node`
attribute (`unknown_node` when it has none); it is *borrowed* when that node is known and the block is
unaffine or affine to another host; blocks count under their `host:` node (`no_affinity` otherwise); for
real pools every known node is pre-seeded with 0 in the per-node allocation gauges.
"""

from __future__ import annotations

DEFAULT_METRICS_PORT = 9094  # calico-kube-controllers' prometheusMetricsPort
# Seconds between the active watcher's computations from Redis (candidates, shard depths, pools,
# Redis-kept counters): Prometheus scrapes every 15–30 s, and no scrape triggers Redis work.
DEFAULT_REFRESH_SECONDS = 15.0

# -- Calico's (spec §7), exact names and labels ------------------------------------------------------------

IPAM_IN_USE = "ipam_allocations_in_use"
IPAM_BORROWED = "ipam_allocations_borrowed"
IPAM_BLOCKS = "ipam_blocks"
IPAM_GC_CANDIDATES = "ipam_allocations_gc_candidates"
IPAM_GC_RECLAMATIONS = "ipam_allocations_gc_reclamations"
IPAM_POOL_SIZE = "ipam_ippool_size"
IPAM_POOL_RESERVED = "ipam_ippool_reserved"  # 3.33
# Calico's legacy per-node series, label `node` only (still served by 3.33; producer/pool_metrics.py)
IPAM_LEGACY_ALLOCATIONS = "ipam_allocations_per_node"
IPAM_LEGACY_BORROWED = "ipam_allocations_borrowed_per_node"
IPAM_LEGACY_BLOCKS = "ipam_blocks_per_node"
LABEL_POOL = "ippool"
LABEL_NODE = "node"
NO_IPPOOL = "no_ippool"
UNKNOWN_NODE = "unknown_node"
NO_AFFINITY = "no_affinity"

# -- ipamgc's own ---------------------------------------------------------------------------------------

BUILD_INFO = "ipamgc_build_info"  # gauge 1 {component, version}, every process
# watcher (each process counts its own; only the active one has non-zero values)
WATCH_EVENTS = "ipamgc_watch_events"  # counter {kind}: watch events received
WATCH_LISTS = "ipamgc_watch_lists"  # counter {kind}: complete lists (the first and every relist)
WATCH_RELISTS = "ipamgc_watch_relists"  # counter {kind}: lists after the first (410 Gone, errors)
WATCH_ERRORS = "ipamgc_watch_errors"  # counter {kind}: failed lists/watches (retried with back-off)
WATCH_EXPIRED = "ipamgc_watch_expired"  # counter {kind}: 410 Gone answers
WATCH_MALFORMED = "ipamgc_watch_malformed"  # counter {kind}: objects that could not be typed
WATCHER_IS_LEADER = "ipamgc_watcher_is_leader"  # gauge: holds the watcher Lease and publishes
WATCHER_SYNCED = "ipamgc_watcher_synced"  # gauge: the initial list of every kind is mirrored
WATCHER_BATCHES = "ipamgc_watcher_batches"  # counter: event batches applied to the mirror
WATCHER_PUBLISHED = "ipamgc_watcher_published"  # counter: allocation ids newly marked dirty
WATCHER_ENQUEUED = "ipamgc_watcher_enqueued"  # counter: shard jobs enqueued
WATCHER_RESYNCS = "ipamgc_watcher_resyncs"  # counter: periodic backstop passes
WATCHER_BACKSTOP_WALKED = "ipamgc_watcher_backstop_walked"  # counter: allocations the sweep looked at
WATCHER_BACKSTOP_DIRTIED = "ipamgc_watcher_backstop_dirtied"  # counter: ids the backstop newly marked dirty
WATCHER_BACKSTOP_REPAIRS = "ipamgc_watcher_backstop_repairs"  # counter {kind}: mirror records not as written
WATCHER_REDIS_ERRORS = "ipamgc_watcher_redis_errors"  # counter: Redis failures (retried)
LAST_FULL_RESYNC = "ipamgc_last_full_resync_timestamp_seconds"  # gauge (Calico #8137's proposal)
METRICS_REFRESH_SECONDS = "ipamgc_metrics_refresh_seconds"  # gauge: duration of the last refresh
METRICS_REFRESH_TIMESTAMP = "ipamgc_metrics_refresh_timestamp_seconds"  # gauge: when it ended
# shards (active watcher, from Redis)
SHARD_DIRTY = "ipamgc_shard_dirty"  # gauge {shard}: allocation ids waiting for validation
SHARD_INFLIGHT = "ipamgc_shard_inflight"  # gauge {shard}: ids leased by a running job
SHARD_CANDIDATES = "ipamgc_shard_candidates"  # gauge {shard}: candidate or confirmed leaks
SHARD_DUE = "ipamgc_shard_due"  # gauge {shard}: candidates waiting for their grace period
# gauge {shard}: while a pass over every allocation is pending (a cold start), the shard's allocations
SHARD_REVALIDATING = "ipamgc_shard_revalidating"
# Redis's own memory (active watcher, `INFO memory` in the refresh): writes fail at maxmemory (noeviction)
REDIS_USED_MEMORY = "ipamgc_redis_used_memory_bytes"  # gauge: `used_memory`
REDIS_MAXMEMORY = "ipamgc_redis_maxmemory_bytes"  # gauge: `maxmemory`, 0 when unbounded
# workers (kept in Redis by every worker process, exposed by the active watcher)
VALIDATION_BATCH_SECONDS = "ipamgc_validation_batch_seconds"  # histogram: one batch, read to write
VALIDATED = "ipamgc_validated"  # counter: verdicts written
DECISIONS = "ipamgc_decisions"  # counter {reason}: release decisions emitted
# leader (each process its own)
RELEASES = "ipamgc_releases"  # counter {result, object}: the leader's audit records
LEADER_IS_LEADER = "ipamgc_leader_is_leader"  # gauge: holds the leader Lease
LEADER_EPOCH = "ipamgc_leader_epoch"  # gauge: fencing epoch of its last term (0 before the first)
# counter: audit records this leader numbered that the stream was later found not to hold (a failover or
# rollback that lost writes, a write Redis refused): `ipamgc audit` names the gaps
AUDIT_RECORDS_LOST = "ipamgc_audit_records_lost"
# ipamgc's own API requests, under client-go's names (kubeio/requestmetrics.py); each process its own
REST_REQUESTS = "rest_client_requests"  # counter {verb, resource, code}: code `<error>` without an answer
REST_DURATION = "rest_client_request_duration_seconds"  # histogram {verb, resource}
# The leader's handle collector (docs/handles.md), label `class`: orphan, skewed, missing, stuck-deleted.
HANDLE_GC_DIVERGENT = "ipamgc_handle_gc_divergent"  # gauge: handles found divergent at the last scan
HANDLE_GC_FOUND = "ipamgc_handle_gc_found"  # counter: divergences first seen (a new or changed one)
HANDLE_GC_REPAIRED = "ipamgc_handle_gc_repaired"  # counter {class, action}: IPAMHandle writes made
HANDLE_GC_REFUSED = "ipamgc_handle_gc_refused"  # counter {class, reason}: due, and not written

# Upper bounds of the validation batch histogram, seconds: a batch of 1,000 ids takes ~40 ms on the
# measured machine; the tail up to 10 s is a slow Redis or a starved worker.
BATCH_SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

# -- fields of the Redis-kept counters (`Keys.metrics`, a hash) -----------------------------------------

FIELD_BATCH_SUM = "batch_sum"
FIELD_VALIDATED = "validated"
BUCKET_FIELD_PREFIX = "batch_le|"  # + index into BATCH_SECONDS_BUCKETS, or `inf` (not cumulative)
DECISION_FIELD_PREFIX = "decisions|"  # + reason


def bucket_field(seconds: float) -> str:
    """The histogram field a batch of `seconds` is counted in (buckets are stored non-cumulative)."""
    for i, bound in enumerate(BATCH_SECONDS_BUCKETS):
        if seconds <= bound:
            return f"{BUCKET_FIELD_PREFIX}{i}"
    return f"{BUCKET_FIELD_PREFIX}inf"


def reclaimed_field(block: str, node: str) -> str:
    """Field of `Keys.reclaimed`: IPs the leader released from `block` whose `node` attribute is `node`."""
    return f"{block}|{node}"


# -- heartbeats (`Keys.health`), read by `ipamgc health` --------------------------------------------------

COMPONENTS = ("watcher", "worker", "leader")
# A process writes its heartbeat this often (seconds): one SET a process every 30 s is part of the idle
# floor (docs/benchmarks.md, "Cost by event rate"); the kubelet's probes read /livez, not this key, which
# `ipamgc status` and `ipamgc health` read …
HEARTBEAT_INTERVAL_SECONDS = 30.0
# … with this TTL, which is also the age past which a probe calls it dead: three missed beats.
HEARTBEAT_TTL_SECONDS = 90.0
# A main loop that has not come round for this long is stuck: the process stops beating (the watcher's
# longest step, a relist of 150,000 pods, takes a few seconds; the leader's is one rate-limited pass).
STALL_SECONDS = 120.0

EXPOSED = (
    IPAM_IN_USE,
    IPAM_BORROWED,
    IPAM_BLOCKS,
    IPAM_GC_CANDIDATES,
    IPAM_GC_RECLAMATIONS,
    IPAM_POOL_SIZE,
    IPAM_POOL_RESERVED,
    IPAM_LEGACY_ALLOCATIONS,
    IPAM_LEGACY_BORROWED,
    IPAM_LEGACY_BLOCKS,
    BUILD_INFO,
    WATCH_EVENTS,
    WATCH_LISTS,
    WATCH_RELISTS,
    WATCH_ERRORS,
    WATCH_EXPIRED,
    WATCH_MALFORMED,
    WATCHER_IS_LEADER,
    WATCHER_SYNCED,
    WATCHER_BATCHES,
    WATCHER_PUBLISHED,
    WATCHER_ENQUEUED,
    WATCHER_RESYNCS,
    WATCHER_BACKSTOP_WALKED,
    WATCHER_BACKSTOP_DIRTIED,
    WATCHER_BACKSTOP_REPAIRS,
    WATCHER_REDIS_ERRORS,
    LAST_FULL_RESYNC,
    METRICS_REFRESH_SECONDS,
    METRICS_REFRESH_TIMESTAMP,
    SHARD_DIRTY,
    SHARD_INFLIGHT,
    SHARD_CANDIDATES,
    SHARD_DUE,
    SHARD_REVALIDATING,
    REDIS_USED_MEMORY,
    REDIS_MAXMEMORY,
    VALIDATION_BATCH_SECONDS,
    VALIDATED,
    DECISIONS,
    RELEASES,
    LEADER_IS_LEADER,
    LEADER_EPOCH,
    AUDIT_RECORDS_LOST,
    HANDLE_GC_DIVERGENT,
    HANDLE_GC_FOUND,
    HANDLE_GC_REPAIRED,
    HANDLE_GC_REFUSED,
    REST_REQUESTS,
    REST_DURATION,
)
"""Metric family names, as registered (counters gain `_total`, histograms `_bucket`/`_sum`/`_count`)."""
