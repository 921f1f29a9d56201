"""The active watcher's metrics: Calico's IPAM gauges kept incrementally, and what Redis holds, exposed once.

Calico 3.26 recomputed its IPAM metrics from every allocation after every sync: that was part of the
#7841 cost.  Here nothing is recomputed per event:
- `BlockTally` keeps, per block CIDR, what the block contributes (allocations per `node` attribute,
  borrowed ones, its host) and the totals per (pool, node).  The mirror calls `observe` for every block
  it is given (unchanged ones too, so a relist — the first thing a new active watcher does — brings the
  tally up to date after a fail-over), and an update costs the size of that one block.  Blocks map to
  IPPools by CIDR containment; the pools change rarely and regroup the tally in O(blocks) when they do.
- Every `interval` (15 s), only while this replica leads, `WatcherMetrics.refresh` lists the IPPools
  (cluster-wide `list`; a handful of objects, not worth a watch) and reads Redis in one pipeline: shard
  depths, node names (Calico's zero pre-seeding), the counters that worker processes and the leader keep
  there (`P:metrics`, `P:reclaimed`), the last full resync, and the candidates (`cand:{s}`, scanned, with
  their nodes from `alloc:{s}`): O(candidates), which Calico expects to stay near zero.
- Scrapes read only memory.

Why counters of other processes are exposed here (see also `workers/metrics.py`): several worker
processes, on several hosts, add to the same counters; prometheus-client's multiprocess mode only
aggregates processes sharing one directory on one host, so the workers add to a Redis hash in the
pipeline they already send and one process — this one — exposes the sums.  A standby watcher exposes its
own counters only, never the cluster's, so `sum()` over replicas never double-counts.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

import redis
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from producer.kube import WATCHED, KubeApi, list_calico_items
from producer.pool_metrics import legacy_families, list_ipreservations, reserved_family
from producer.watcher import Watcher
from shared import metrics_names as m
from shared.codec import RecordError
from shared.errors import IpamgcError
from shared.keys import STATE_LAST_FULL_RESYNC, Keys
from shared.netaddr import AddressError, IPNetwork, parse_network
from shared.records import BlockRecord, decode_allocation

log = logging.getLogger(__name__)

PoolNode = tuple[str, str]


# -- IPPools ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, order=True)
class IPPool:
    name: str
    network: IPNetwork

    @property
    def size(self) -> int:
        return int(self.network.num_addresses)


def parse_ippools(items: Iterable[object]) -> tuple[IPPool, ...]:
    """Pools from raw IPPool objects; one being deleted counts as gone (§1.1), a malformed one is skipped."""
    pools = []
    for raw in items:
        meta = raw.get("metadata") if isinstance(raw, dict) else None
        spec = raw.get("spec") if isinstance(raw, dict) else None
        if not isinstance(meta, dict) or not isinstance(spec, dict) or meta.get("deletionTimestamp"):
            continue
        name, cidr = meta.get("name"), spec.get("cidr")
        try:
            if isinstance(name, str) and name and isinstance(cidr, str):
                pools.append(IPPool(name, parse_network(cidr, strict=False)))
                continue
        except AddressError:
            pass
        log.warning("IPPool %r with unreadable cidr %r left out of the metrics", name, cidr)
    return tuple(sorted(pools))


def list_ippools(api: KubeApi, timeout: tuple[float, float] = (10.0, 30.0)) -> tuple[IPPool, ...]:
    """Every IPPool (`list ippools` in the chosen Calico group, raw JSON, no client models)."""
    return parse_ippools(list_calico_items(api, "ippools", timeout))


def pool_of_network(net: IPNetwork, pools: Iterable[IPPool]) -> str:
    """The most specific pool containing `net` (pools do not overlap in Calico), else `no_ippool`."""
    best: IPPool | None = None
    for p in pools:
        contains = p.network.version == net.version and net.subnet_of(p.network)  # type: ignore[arg-type]
        if contains and (best is None or p.network.prefixlen > best.network.prefixlen):
            best = p
    return best.name if best is not None else m.NO_IPPOOL


def pool_of_block(cidr: str, pools: Iterable[IPPool]) -> str:
    try:
        return pool_of_network(parse_network(cidr), pools)
    except AddressError:
        return m.NO_IPPOOL


def pool_of_ip(ip: str, pools: Iterable[IPPool]) -> str:
    try:
        return pool_of_network(ipaddress.ip_network(ip), pools)
    except ValueError:
        return m.NO_IPPOOL


# -- the incremental tally --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BlockFacts:
    """What one block contributes to Calico's gauges."""

    host: str | None
    in_use: Mapping[str, int]  # `node` attribute (or unknown_node) → allocations
    borrowed: Mapping[str, int]  # known `node` attribute ≠ host → allocations

    @classmethod
    def of(cls, rec: BlockRecord) -> BlockFacts:
        return cls.counted(rec.host, Counter(slot.attrs.get("node", "") for slot in rec.slots.values()))

    @classmethod
    def counted(cls, host: str | None, nodes: Mapping[str, int]) -> BlockFacts:
        """From a block's allocations per `node` attribute ("" for none)."""
        in_use = dict(nodes)
        borrowed = {n: c for n, c in in_use.items() if n and n != host}
        if "" in in_use:
            in_use[m.UNKNOWN_NODE] = in_use.get(m.UNKNOWN_NODE, 0) + in_use.pop("")
        return cls(host, in_use, borrowed)


@dataclass(frozen=True, slots=True)
class Totals:
    pools: tuple[IPPool, ...]
    in_use: dict[PoolNode, int]
    borrowed: dict[PoolNode, int]
    blocks: dict[PoolNode, int]


class BlockTally:
    """Totals of Calico's per-(pool, node) gauges, updated by the blocks that change (thread-safe)."""

    def __init__(self, pools: Iterable[IPPool] = ()) -> None:
        self._lock = threading.Lock()
        self._pools = tuple(sorted(pools))
        self._facts: dict[str, BlockFacts] = {}
        self._pool: dict[str, str] = {}
        # What `observe_counts` was last told of each block: most blocks a batch sees did not change their
        # counts (an update of an attribute, a re-list), and comparing two small dicts in C is cheaper
        # than building the block's facts to find that out.
        self._counts: dict[str, tuple[str | None, dict[str, int]]] = {}
        self._in_use: Counter[PoolNode] = Counter()
        self._borrowed: Counter[PoolNode] = Counter()
        self._blocks: Counter[PoolNode] = Counter()

    def observe(self, cidr: str, rec: BlockRecord | None) -> None:
        """The block `cidr` is now `rec` (None: gone)."""
        facts = BlockFacts.of(rec) if rec is not None else None
        with self._lock:
            self._counts.pop(cidr, None)
            self._observe(cidr, facts)

    def observe_counts(self, cidr: str, host: str | None, nodes: Mapping[str, int] | None) -> None:
        """The block `cidr` now has `host` and these allocations per node (None: gone).  The mirror calls
        this for every block it sees."""
        seen = (host, dict(nodes)) if nodes is not None else None
        with self._lock:
            if seen is None:
                self._counts.pop(cidr, None)
                self._observe(cidr, None)
            elif self._counts.get(cidr) != seen:
                self._counts[cidr] = seen
                self._observe(cidr, BlockFacts.counted(host, seen[1]))

    def _observe(self, cidr: str, facts: BlockFacts | None) -> None:
        """Under `_lock`."""
        old = self._facts.get(cidr)
        if old == facts:
            return
        pool = None
        if old is not None:
            pool = self._pool.pop(cidr)
            self._add(pool, old, -1)
            del self._facts[cidr]
        if facts is not None:
            # A block's pool changes only with the pools (`set_pools` regroups every block).
            pool = pool if pool is not None else pool_of_block(cidr, self._pools)
            self._facts[cidr] = facts
            self._pool[cidr] = pool
            self._add(pool, facts, 1)

    def set_pools(self, pools: Iterable[IPPool]) -> bool:
        """Regroup every block under the current pools (O(blocks)); False when they did not change."""
        fresh = tuple(sorted(pools))
        with self._lock:
            if fresh == self._pools:
                return False
            self._pools = fresh
            self._in_use.clear()
            self._borrowed.clear()
            self._blocks.clear()
            for cidr, facts in self._facts.items():
                pool = self._pool[cidr] = pool_of_block(cidr, fresh)
                self._add(pool, facts, 1)
            return True

    def _add(self, pool: str, facts: BlockFacts, sign: int) -> None:
        for counter, values in ((self._in_use, facts.in_use), (self._borrowed, facts.borrowed)):
            for node, n in values.items():
                _bump(counter, (pool, node), sign * n)
        _bump(self._blocks, (pool, facts.host or m.NO_AFFINITY), sign)

    def totals(self) -> Totals:
        with self._lock:
            return Totals(self._pools, dict(self._in_use), dict(self._borrowed), dict(self._blocks))

    def nodes(self) -> set[str]:
        """Nodes that still own a block or are named by an allocation."""
        with self._lock:
            return {n for _, n in self._in_use} | {n for _, n in self._blocks}


def _bump(counter: Counter[PoolNode], key: PoolNode, n: int) -> None:
    value = counter[key] + n
    if value:
        counter[key] = value
    else:
        del counter[key]


# -- what the refresh reads from Redis ----------------------------------------------------------------------


@dataclass(slots=True)
class Reading:
    """One refresh: Redis state and the pools, mapped to the labels they are exposed with."""

    at: float
    seconds: float
    pools: tuple[IPPool, ...]
    nodes: frozenset[str]
    shards: dict[str, tuple[int, int, int, int]]  # shard → (dirty, inflight, candidates, due)
    candidates: dict[PoolNode, int]
    reclaimed: dict[PoolNode, int]
    counters: dict[str, float]
    last_full_resync: float | None


def _text(raw: object) -> str:
    return raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)


def read_redis(
    client: redis.Redis, keys: Keys, shards: int, pools: tuple[IPPool, ...], chunk: int = 1000
) -> Reading:
    """Everything the refresh needs from Redis (pools map candidates and reclamations to their labels)."""
    started = time.monotonic()
    pipe = client.pipeline(transaction=False)
    for s in range(shards):
        pipe.scard(keys.dirty(s))
        pipe.zcard(keys.inflight(s))
        pipe.hlen(keys.cand(s))
        pipe.zcard(keys.due(s))
    pipe.hkeys(keys.nodes)
    pipe.hgetall(keys.metrics)
    pipe.hgetall(keys.reclaimed)
    pipe.hget(keys.state, STATE_LAST_FULL_RESYNC)
    *depths, nodes, counters, reclaimed, resync = pipe.execute()
    by_shard: dict[str, tuple[int, int, int, int]] = {}
    for s in range(shards):
        dirty, inflight, cand, due = (int(x) for x in depths[4 * s : 4 * s + 4])
        by_shard[str(s)] = (dirty, inflight, cand, due)
    candidates: Counter[PoolNode] = Counter()
    for s in range(shards):
        if by_shard[str(s)][2]:
            for ip, node in _candidates(client, keys, s, chunk):
                candidates[(pool_of_ip(ip, pools), node)] += 1
    reclaims: Counter[PoolNode] = Counter()
    for f, v in reclaimed.items():
        block, _, node = _text(f).partition("|")
        reclaims[(pool_of_block(block, pools), node)] += int(v)
    values: dict[str, float] = {}
    for f, v in counters.items():
        with contextlib.suppress(ValueError):
            values[_text(f)] = float(v)
    last = None
    with contextlib.suppress(TypeError, ValueError):
        last = float(resync) if resync is not None else None
    return Reading(
        at=time.time(),
        seconds=time.monotonic() - started,
        pools=pools,
        nodes=frozenset(_text(n) for n in nodes),
        shards=by_shard,
        candidates=dict(candidates),
        reclaimed=dict(reclaims),
        counters=values,
        last_full_resync=last,
    )


def _candidates(client: redis.Redis, keys: Keys, shard: int, chunk: int) -> Iterator[tuple[str, str]]:
    """(ip, node attribute) of every candidate or confirmed leak of a shard (HSCAN, then HMGET chunks)."""
    ids: list[str] = []
    for f, _ in client.hscan_iter(keys.cand(shard), count=chunk):
        ids.append(_text(f))
    for i in range(0, len(ids), chunk):
        part = ids[i : i + chunk]
        for alloc_id, raw in zip(part, client.hmget(keys.alloc(shard), part), strict=True):
            if not isinstance(raw, bytes):
                continue  # vanished since: its timer goes with it
            try:
                a = decode_allocation(alloc_id, raw)
            except RecordError:
                continue  # logged where it matters (the worker skips it too)
            yield a.ip, a.node or m.UNKNOWN_NODE


# -- exposition ---------------------------------------------------------------------------------------------


class WatcherMetrics:
    """Wires the tally into the watcher's mirror, refreshes from Redis while leading, and is the collector.

    `registry` None: nothing is registered (tests call `collect()`).  `start()` runs the refresh thread;
    `stop()` ends it and unregisters.
    """

    def __init__(
        self,
        watcher: Watcher,
        registry: CollectorRegistry | None,
        *,
        interval: float = m.DEFAULT_REFRESH_SECONDS,
        list_pools: Callable[[], tuple[IPPool, ...]] | None = None,
        list_reservations: Callable[[], tuple[IPNetwork, ...]] | None = None,
        prune_after: float = 120.0,
    ) -> None:
        self.watcher = watcher
        self.registry = registry
        self.interval = interval
        self.prune_after = prune_after
        self.tally = BlockTally()
        self.reading: Reading | None = None
        api = watcher.api
        self._list_pools = list_pools or (lambda: list_ippools(api))
        self._list_reservations = list_reservations or (lambda: list_ipreservations(api))
        self._pools: tuple[IPPool, ...] | None = None
        self.reservations: tuple[IPNetwork, ...] = ()  # IPReservations' CIDRs, listed with the pools
        self._prunable: dict[bytes, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        watcher.mirror.block_observer = self.tally.observe_counts
        self._collector = _Collector(self)
        if registry is not None:
            registry.register(self._collector)

    # -- the refresh -----------------------------------------------------------------------------------

    def refresh(self) -> Reading:
        """List the pools (the last good list is kept on an API error) and read Redis once."""
        try:
            self._pools = self._list_pools()
        except IpamgcError as exc:
            log.warning("metrics: cannot list IPPools, keeping the last list: %s", exc)
            if self._pools is None:
                self._pools = ()
        try:
            self.reservations = self._list_reservations()
        except IpamgcError as exc:
            log.warning("metrics: cannot list IPReservations, keeping the last list: %s", exc)
        self.tally.set_pools(self._pools)
        w = self.watcher
        reading = read_redis(w.mirror.redis, w.keys, w.settings.shards, self._pools)
        self._prune(reading)
        self.reading = reading
        return reading

    def _prune(self, reading: Reading) -> None:
        """Calico drops a deleted node's reclamation series once its affinities are released: here, once
        the node has been gone, with nothing of it in the mirror, for `prune_after` seconds."""
        w = self.watcher
        alive = set(reading.nodes) | self.tally.nodes()
        now = time.monotonic()
        gone: list[bytes] = []
        seen: set[bytes] = set()
        for name in w.mirror.redis.hkeys(w.keys.reclaimed):
            if not isinstance(name, bytes):
                continue
            if _text(name).rpartition("|")[2] in alive:
                continue
            seen.add(name)
            since = self._prunable.setdefault(name, now)
            if now - since >= self.prune_after:
                gone.append(name)
        self._prunable = {f: t for f, t in self._prunable.items() if f in seen and f not in gone}
        if gone:
            w.mirror.redis.hdel(w.keys.reclaimed, *gone)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="ipamgc-metrics", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.registry is not None:
            with contextlib.suppress(KeyError):
                self.registry.unregister(self._collector)

    def _loop(self) -> None:
        """Refresh every `interval` while leading, and at once when the initial sync completes (the
        node names and candidates of a refresh made before it would be empty)."""
        due = 0.0
        synced = False
        while True:
            w = self.watcher
            if w.leading and (time.monotonic() >= due or (w.synced.is_set() and not synced)):
                synced = w.synced.is_set()
                try:
                    self.refresh()
                except redis.RedisError as exc:
                    log.warning("metrics refresh failed, gauges kept from the last one: %s", exc)
                due = time.monotonic() + self.interval
            if self._stop.wait(min(0.2, self.interval)):
                return

    # -- the collector -----------------------------------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        w = self.watcher
        yield from _watcher_families(w)
        reading = self.reading
        if not w.leading or reading is None:
            return
        yield from _refresh_families(reading)
        if w.synced.is_set():
            totals = self.tally.totals()
            yield from _calico_families(totals, reading)
            yield from legacy_families(totals.in_use, totals.borrowed, totals.blocks)
            yield reserved_family({p.name: p.network for p in totals.pools}, self.reservations)


class _Collector(Collector):
    def __init__(self, owner: WatcherMetrics) -> None:
        self.owner = owner

    def describe(self) -> list[Metric]:
        return []  # no collection at registration (it would run before the watcher has started)

    def collect(self) -> Iterator[Metric]:
        return self.owner.collect()


def watcher_health(watcher: Watcher, stall: float = m.STALL_SECONDS) -> tuple[bool, str]:
    """(alive, state) for the heartbeat: alive while the standby wait or the publish loop comes round."""
    alive = time.monotonic() - watcher.progress_at < stall and not watcher.stopping
    if not watcher.leading:
        return alive, "standby"
    return alive, "active" if watcher.synced.is_set() else "syncing"


def _watcher_families(w: Watcher) -> Iterator[Metric]:
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
        (m.WATCHER_RESYNCS, stats.get("resyncs", 0), "Periodic full resyncs."),
        (m.WATCHER_REDIS_ERRORS, stats.get("redis_errors", 0), "Redis failures, retried."),
        (m.WATCHER_PUBLISHED, w.mirror.stats.published, "Allocation ids newly marked dirty."),
        (m.WATCHER_ENQUEUED, w.mirror.stats.enqueued, "Shard jobs enqueued."),
    )
    for name, value, doc in plain:
        yield CounterMetricFamily(name, doc, value=value)
    yield GaugeMetricFamily(m.WATCHER_IS_LEADER, "1 while this watcher holds the Lease.", value=w.leading)
    yield GaugeMetricFamily(m.WATCHER_SYNCED, "1 once every kind is listed.", value=w.synced.is_set())


def _refresh_families(r: Reading) -> Iterator[Metric]:
    yield GaugeMetricFamily(m.METRICS_REFRESH_SECONDS, "Duration of the last refresh.", value=r.seconds)
    yield GaugeMetricFamily(m.METRICS_REFRESH_TIMESTAMP, "When the last refresh ended.", value=r.at)
    docs = (
        (m.SHARD_DIRTY, "Allocation ids waiting for validation."),
        (m.SHARD_INFLIGHT, "Allocation ids leased by a running shard job."),
        (m.SHARD_CANDIDATES, "Candidate or confirmed leaks (timers kept)."),
        (m.SHARD_DUE, "Candidates waiting for their grace period to end."),
    )
    for i, (name, doc) in enumerate(docs):
        fam = GaugeMetricFamily(name, doc, labels=["shard"])
        for shard, depths in r.shards.items():
            fam.add_metric([shard], depths[i])
        yield fam
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


def _calico_families(t: Totals, r: Reading) -> Iterator[Metric]:
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
