"""The watcher's metric families: its own counters, the refresh's reading, and Calico's IPAM series.

Why a module: turning numbers into Prometheus families (names, help texts, labels, Calico's zero
pre-seeding of every pool and node, the workers' histogram stored non-cumulative in Redis) is apart from
keeping the numbers (`producer/tally.py`, `producer/metrics_reading.py`) and from when they are refreshed
(`producer/metrics.py`).  Each function is called at a scrape and reads only memory.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from producer.kinds import WATCHED
from producer.metrics_reading import Reading
from producer.tally import PoolNode, Totals
from producer.watcher import Watcher
from shared import metrics_names as m


def watcher_families(w: Watcher) -> Iterator[Metric]:
    stats = w.stats.snapshot()
    per_kind = (
        (m.WATCH_EVENTS, "events", "Watch events received."),
        (m.WATCH_LISTS, "lists", "Complete lists (the first and every relist)."),
        (m.WATCH_RELISTS, "relists", "Lists after the first one (410 Gone, errors)."),
        (m.WATCH_ERRORS, "errors", "Failed lists and watches, retried with back-off."),
        (m.WATCH_EXPIRED, "expired", "410 Gone answers (resourceVersion compacted away)."),
        (m.WATCH_MALFORMED, "malformed", "Objects that could not be typed (kept as what keeps IPs)."),
    )
    for name, stat, doc in per_kind:
        fam = CounterMetricFamily(name, doc, labels=["kind"])
        for kind in WATCHED:
            fam.add_metric([kind.value], stats.get(f"{stat}.{kind.value}", 0))
        yield fam
    plain = (
        (m.WATCHER_BATCHES, stats.get("batches", 0), "Event batches applied to the mirror."),
        (m.WATCHER_RESYNCS, stats.get("resyncs", 0), "Periodic backstop passes."),
        (m.WATCHER_BACKSTOP_WALKED, stats.get("backstop_walked", 0), "Allocations the sweep walked."),
        (m.WATCHER_BACKSTOP_DIRTIED, stats.get("backstop_dirtied", 0), "Ids the backstop dirtied."),
        (m.WATCHER_REDIS_ERRORS, stats.get("redis_errors", 0), "Redis failures, retried."),
        (
            m.WATCHER_PUBLISHED,
            w.mirror.stats.published,
            "Allocation ids newly marked dirty (or, at a cold start, left to its pass).",
        ),
        (m.WATCHER_ENQUEUED, w.mirror.stats.enqueued, "Shard jobs enqueued."),
    )
    for name, value, doc in plain:
        yield CounterMetricFamily(name, doc, value=value)
    repairs = CounterMetricFamily(
        m.WATCHER_BACKSTOP_REPAIRS, "Mirror records found not as written (relisted).", labels=["kind"]
    )
    for mirrored in ("blocks", "pods", "nodes"):
        repairs.add_metric([mirrored], stats.get(f"backstop_repairs.{mirrored}", 0))
    yield repairs
    yield GaugeMetricFamily(m.WATCHER_IS_LEADER, "1 while this watcher holds the Lease.", value=w.leading)
    yield GaugeMetricFamily(m.WATCHER_SYNCED, "1 once every kind is listed.", value=w.synced.is_set())


def refresh_families(r: Reading) -> Iterator[Metric]:
    yield GaugeMetricFamily(m.METRICS_REFRESH_SECONDS, "Duration of the last refresh.", value=r.seconds)
    yield GaugeMetricFamily(m.METRICS_REFRESH_TIMESTAMP, "When the last refresh ended.", value=r.at)
    docs = (
        (m.SHARD_DIRTY, "Allocation ids waiting for validation."),
        (m.SHARD_INFLIGHT, "Allocation ids leased by a running shard job."),
        (m.SHARD_CANDIDATES, "Candidate or confirmed leaks (timers kept)."),
        (m.SHARD_DUE, "Candidates waiting for their grace period to end."),
        (m.SHARD_REVALIDATING, "Allocations a pending pass over every allocation covers (0: none pending)."),
    )
    for i, (name, doc) in enumerate(docs):
        fam = GaugeMetricFamily(name, doc, labels=["shard"])
        for shard, depths in r.shards.items():
            fam.add_metric([shard], depths[i])
        yield fam
    yield GaugeMetricFamily(m.REDIS_USED_MEMORY, "Redis's used_memory (INFO memory).", value=r.used_memory)
    doc = "Redis's maxmemory (INFO memory); 0 when unbounded."
    yield GaugeMetricFamily(m.REDIS_MAXMEMORY, doc, value=r.maxmemory)
    if r.last_full_resync is not None:
        doc = "When the last full resync ended."
        yield GaugeMetricFamily(m.LAST_FULL_RESYNC, doc, value=r.last_full_resync)
    c = r.counters
    yield CounterMetricFamily(m.VALIDATED, "Verdicts written by workers.", value=c.get(m.FIELD_VALIDATED, 0))
    decisions = CounterMetricFamily(m.DECISIONS, "Release decisions emitted, by reason.", labels=["reason"])
    for f, v in sorted(c.items()):
        if f.startswith(m.DECISION_FIELD_PREFIX):
            decisions.add_metric([f.removeprefix(m.DECISION_FIELD_PREFIX)], v)
    yield decisions
    buckets: list[tuple[str, float]] = []
    cumulative = 0.0
    for i, bound in enumerate(m.BATCH_SECONDS_BUCKETS):
        cumulative += c.get(f"{m.BUCKET_FIELD_PREFIX}{i}", 0.0)
        buckets.append((_float_text(bound), cumulative))
    buckets.append(("+Inf", cumulative + c.get(f"{m.BUCKET_FIELD_PREFIX}inf", 0.0)))
    yield HistogramMetricFamily(
        m.VALIDATION_BATCH_SECONDS,
        "Seconds to validate one batch, from reading it to writing its outcome.",
        buckets=buckets,
        sum_value=c.get(m.FIELD_BATCH_SUM, 0.0),
    )


def calico_families(t: Totals, r: Reading) -> Iterator[Metric]:
    labels = [m.LABEL_POOL, m.LABEL_NODE]
    seeded = [p.name for p in t.pools]
    families: list[tuple[str, str, dict[PoolNode, int], bool]] = [
        (m.IPAM_IN_USE, "Tracked IPAM allocations in use, per pool and node.", t.in_use, True),
        (m.IPAM_BORROWED, "Allocations in a block affine to another host.", t.borrowed, True),
        (m.IPAM_BLOCKS, "IPAM blocks per pool and affine host.", t.blocks, False),
        (m.IPAM_GC_CANDIDATES, "Allocations that are candidate or confirmed leaks.", r.candidates, True),
    ]
    for name, doc, values, seed in families:
        fam = GaugeMetricFamily(name, doc, labels=labels)
        full = dict(values)
        if seed:
            for pool in seeded:
                for node in r.nodes:
                    full.setdefault((pool, node), 0)
        for (pool, node), v in sorted(full.items()):
            fam.add_metric([pool, node], v)
        yield fam
    untyped = Metric(m.IPAM_GC_RECLAMATIONS, "IPs released by the garbage collector (a counter).", "unknown")
    for (pool, node), v in sorted(r.reclaimed.items()):
        untyped.add_sample(m.IPAM_GC_RECLAMATIONS, {m.LABEL_POOL: pool, m.LABEL_NODE: node}, v)
    yield untyped
    size = GaugeMetricFamily(m.IPAM_POOL_SIZE, "Addresses in the IP pool.", labels=[m.LABEL_POOL])
    for p in t.pools:
        size.add_metric([p.name], p.size)
    yield size


def _float_text(bound: float) -> str:
    return repr(float(bound))
