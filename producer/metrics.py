"""The active watcher's metrics: Calico's IPAM gauges kept incrementally, and what Redis holds, exposed once.

Calico 3.26 recomputed its IPAM metrics from every allocation after every sync: that was part of the
#7841 cost.  Here nothing is recomputed per event:
- `BlockTally` (`producer/tally.py`) keeps the per-(pool, node) totals, updated by the blocks the mirror
  sees; blocks map to IPPools by CIDR containment (`producer/ippools.py`);
- every `interval` (15 s), only while this replica leads, `WatcherMetrics.refresh` lists the IPPools and
  reads Redis in one pipeline (`producer/metrics_reading.py`);
- scrapes read only memory (`producer/metrics_families.py`).

This module wires those together: the tally into the watcher's mirror, the refresh thread, the collector,
and the heartbeat's health.

Why counters of other processes are exposed here (see also `workers/shards/metrics.py`): several worker
processes, on several hosts, add to the same counters; prometheus-client's multiprocess mode only
aggregates processes sharing one directory on one host, so the workers add to a Redis hash in the
pipeline they already send and one process — this one — exposes the sums.  A standby watcher exposes its
own counters only, never the cluster's, so `sum()` over replicas never double-counts.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator

import redis
from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from producer.ippools import IPPool, list_ippools
from producer.metrics_families import calico_families, refresh_families, watcher_families
from producer.metrics_reading import Reading, read_redis, text_of
from producer.pool_metrics import legacy_families, list_ipreservations, reserved_family
from producer.tally import BlockTally
from producer.watcher import Watcher
from shared import metrics_names as m
from shared.errors import IpamgcError
from shared.netaddr import IPNetwork

log = logging.getLogger(__name__)


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
        now = time.monotonic()
        gone: list[bytes] = []
        seen: set[bytes] = set()
        tallied: set[str] | None = None  # the tally's nodes, gathered only when a field needs them
        for name in w.mirror.redis.hkeys(w.keys.reclaimed):
            if not isinstance(name, bytes):
                continue
            node = text_of(name).rpartition("|")[2]
            if node in reading.nodes:
                continue
            if tallied is None:
                tallied = self.tally.nodes()
            if node in tallied:
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
            # Until the initial sync completes, look every 0.2 s (a refresh is wanted as soon as it
            # does); after it, sleep until the next refresh is due: no poll on an idle cluster.
            leading = synced and w.leading
            wait = max(0.0, due - time.monotonic()) if leading else min(0.2, self.interval)
            if self._stop.wait(wait):
                return

    # -- the collector -----------------------------------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        w = self.watcher
        yield from watcher_families(w)
        reading = self.reading
        if not w.leading or reading is None:
            return
        yield from refresh_families(reading)
        if w.synced.is_set():
            totals = self.tally.totals()
            yield from calico_families(totals, reading)
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
