"""The watcher process: one elected replica lists and watches the cluster and publishes dirty allocations.

Threads (all stop on `stop()`, SIGTERM/SIGINT in the entry point, or the loss of the Lease):
- election (`producer/election.py`): standby replicas wait here; the leader renews the Lease;
- one reflector per watched kind (`producer/kube.py`): list, watch, relist after 410, back off; each
  hands typed items to one bounded queue (back-pressure when the publisher falls behind);
- the publisher (the thread that called `run()`): takes items in batches (up to `batch_size`, waiting
  at most `batch_wait_seconds` after the first), merges each kind's events (the last state of an
  object wins; a relist is a barrier), applies them to the `Mirror` (the only writer of the mirror's
  indexes), applies configuration changes with `Mirror.set_config`, marks the mirror synced once the
  first list of every kind is in (nothing is decided before), and `kick`s every `kick_interval_seconds`
  (candidates whose grace period ended, leases of dead workers);
- the resync: every leak grace period / 2 (else 5 minutes, or `resync_period_seconds`), every
  allocation is marked dirty, in chunks with a pause between them (`Mirror.mark_all_dirty`).

Shard jobs go to RQ with msgpack (`ShardEnqueuer`); the producer does not import `workers`, so the
job's dotted path and TTLs are repeated here and pinned equal by a contract test (tests/e2e).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import gc
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import redis
import rq
from kubernetes import client as k8s

from producer.election import LeaseElector
from producer.kube import (
    SYNC_GATED,
    WATCHED,
    Backoff,
    Changed,
    ClusterInfo,
    ControllersConfig,
    IpamConfigObject,
    Item,
    Kind,
    KubeApi,
    Listed,
    ListPage,
    Progress,
    Reflector,
    WatchStats,
    api_client,
)
from producer.kubevirt import KINDS as KUBEVIRT_KINDS
from producer.kubevirt import KubeVirtServed, KubeVirtWatch
from producer.mirror import Kind as MirrorKind
from producer.mirror import Mirror, Relist
from shared.clock import Clock
from shared.codec import pack, unpack
from shared.config import Settings, redis_client
from shared.ipamconfig import CONFIG_NAME, DEFAULT, IPAMConfig
from shared.keys import STATE_LISTING, STATE_SYNCED, Keys
from shared.model import IPAMBlock, Node, Pod
from shared.records import MirroredBlock

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_LOST_LEADERSHIP = 1  # the supervisor restarts the process, which comes back as a standby
EXIT_SOFTWARE = 70  # a watch or resync thread died of a bug (sysexits EX_SOFTWARE): restart
EXIT_MIRROR_LOST = 75  # Redis lost the mirror (restarted empty, flushed): restart to relist (EX_TEMPFAIL)

# The shard job and its RQ options; must equal workers/rq_serializer.py (pinned by tests/e2e).
SHARD_JOB = "workers.validate.shard_job"
JOB_TIMEOUT_SECONDS = 120
RESULT_TTL_SECONDS = 0
FAILURE_TTL_SECONDS = 86_400
_MIRRORED = {Kind.NODES: MirrorKind.NODES, Kind.PODS: MirrorKind.PODS, Kind.BLOCKS: MirrorKind.BLOCKS}


class MsgpackJobSerializer:
    """RQ `Serializer` with msgpack (never pickle), wire-compatible with the workers' serializer."""

    @staticmethod
    def dumps(obj: Any, /) -> bytes:
        return pack(obj)

    @staticmethod
    def loads(data: bytes, /) -> Any:
        return unpack("job", data)


class ShardEnqueuer:
    """`enqueue(shard)` for the Mirror: one RQ job on the shard's queue (callers hold its `queued` flag)."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys
        self._queues: dict[int, rq.Queue] = {}
        self._lock = threading.Lock()

    def __call__(self, shard: int) -> None:
        with self._lock:
            q = self._queues.get(shard)
            if q is None:
                name = self.keys.queue_name(shard)
                q = self._queues[shard] = rq.Queue(
                    name, connection=self.client, serializer=MsgpackJobSerializer
                )
            q.enqueue(
                SHARD_JOB,
                shard,
                prefix=self.keys.prefix,
                job_timeout=JOB_TIMEOUT_SECONDS,
                result_ttl=RESULT_TTL_SECONDS,
                failure_ttl=FAILURE_TTL_SECONDS,
                description=f"validate shard {shard}",
            )


class _Stopping(Exception):
    """Raised from the resync's pause to abort it when the watcher stops."""


class Watcher:
    """See the module docstring.  `run()` blocks; `stop()` may be called from any thread."""

    def __init__(
        self,
        settings: Settings,
        api: k8s.ApiClient,
        client: redis.Redis,
        *,
        clock: Clock | None = None,
    ) -> None:
        self.settings = settings
        self.keys = settings.keys
        self.stats = WatchStats()
        self.api_client = api
        # Monotonic time the standby wait or the publish loop last came round (the heartbeat's liveness).
        self.progress_at = time.monotonic()
        self.mirror = Mirror(
            client,
            self.keys,
            settings.shards,
            ShardEnqueuer(client, self.keys),
            clock=clock,
            queued_ttl=settings.queued_ttl_seconds,
            job_lease=settings.work_lease_seconds,
        )
        self.mirror.on_malformed_block = lambda: self.stats.add("malformed", Kind.BLOCKS)
        self.api = KubeApi(
            api,
            calico=settings.calico_api_group,
            page_size=settings.page_size,
            watch_timeout=settings.watch_timeout_seconds,
            read_margin=settings.watch_read_margin_seconds,
            connect_timeout=settings.connect_timeout_seconds,
            list_timeout=settings.list_timeout_seconds,
        )
        self._stop = threading.Event()
        self.kubevirt = KubeVirtWatch(
            api,
            self.api,
            self._put,
            self.stats,
            self._stop,
            lambda: Backoff(settings.backoff_base_seconds, settings.backoff_max_seconds),
            settings.kubevirt_discovery_seconds,
            self._guarded,
        )
        self._wake = threading.Event()  # leadership gained, or stop
        # Wakes the resync thread: a resync asked for (`_resync_wanted`), the grace period changed (the
        # period follows it), or stop.  It sleeps until its next resync otherwise (it woke every second).
        self._resync_now = threading.Event()
        self._resync_wanted = False
        self.synced = threading.Event()
        # The hand-off from the watch threads: a deque (append and popleft are atomic) and an event set
        # only for the first item of a batch, so the publisher is not woken once per watch event (the
        # condition variable of a queue.Queue was a tenth of the watcher's CPU).
        self._items: collections.deque[Item | KubeVirtServed] = collections.deque()
        self._has_items = threading.Event()
        # Set by `_put` once a batch is full, the list pages pending reach `queue_size`, or a list page or a
        # list's end arrives, and by `stop`; cleared by `_take` as it takes: the publisher sleeps through a
        # batch window in one wait.  (Looking every 50 ms was 20 wake-ups a
        # second whenever anything at all was changing: a fifth of the watcher's CPU at 5 pod events/s.)
        self._full = threading.Event()
        # Objects of list pages handed off and not yet taken: a cold start holds a bounded number of
        # typed objects (`queue_size`), however much faster the lists are read than mirrored.
        self._paged = 0
        # Guards `_paged`; notified by `_take` whenever it has taken items, so that a reflector waiting for
        # room goes on at once (it used to look every 50 ms: a page behind a pending one waited that long).
        self._room = threading.Condition(threading.Lock())
        self._crashed = False
        self._mirror_lost = False
        self.elector: LeaseElector | None = None
        if settings.election:
            self.elector = LeaseElector(
                api,
                namespace=settings.election_namespace,
                name=settings.election_name,
                identity=settings.election_identity,
                lease_seconds=settings.election_lease_seconds,
                renew_seconds=settings.election_renew_seconds,
                retry_seconds=settings.election_retry_seconds,
                on_started=self._wake.set,
                on_lost=self.stop,
            )
        # Publisher state (publisher thread only).
        self._listed: set[Kind] = set()
        self._kcc: dict[str, ControllersConfig] = {}
        self._ready = True  # Calico starts with datastoreReady = true
        self._ci_seen = False
        self._config: tuple[float | None, bool] | None = None
        self._ipam_configs: dict[str, IPAMConfig] = {}
        self._cooldown: int | None = None  # as last written to the mirror
        self._relists: dict[Kind, Relist] = {}
        self.applied_rv: dict[Kind, str] = {}

    # -- control ---------------------------------------------------------------------------------------

    def stop(self) -> None:
        self._stop.set()
        self._full.set()
        self._wake.set()
        self._resync_now.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def leading(self) -> bool:
        return self.elector is None or self.elector.leading.is_set()

    def request_resync(self) -> None:
        """Run a full resync now (then the period restarts)."""
        self._resync_wanted = True
        self._resync_now.set()

    def run(self) -> int:
        """Wait for the Lease, then publish until stopped; returns the process exit status."""
        elector_thread = None
        if self.elector is not None:
            elector_thread = threading.Thread(target=self.elector.run, name="ipamgc-election", daemon=True)
            elector_thread.start()
            while not self._wake.wait(1.0):
                self.progress_at = time.monotonic()
        try:
            if self._stop.is_set():
                return self._exit_status()
            self._lead()
            return self._exit_status()
        finally:
            if self.elector is not None and elector_thread is not None:
                self.elector.stop.set()
                elector_thread.join(timeout=10)
                self.elector.release()

    def _exit_status(self) -> int:
        if self._mirror_lost:
            return EXIT_MIRROR_LOST
        if self._crashed:
            return EXIT_SOFTWARE
        if self.elector is not None and self.elector.lost.is_set():
            return EXIT_LOST_LEADERSHIP
        return EXIT_OK

    def _lead(self) -> None:
        log.info("publishing", extra={"prefix": self.keys.prefix, "shards": self.settings.shards})
        # Nothing is decided until this process has listed everything itself.  A Redis laid out for
        # another shard count raises ConfigError (exit 2); Redis being down is waited out.
        if not self._retrying_redis(self._start_mirror):
            return
        s = self.settings
        reflectors = [
            Reflector(
                self.api,
                kind,
                self._put,
                self.stats,
                self._stop,
                Backoff(s.backoff_base_seconds, s.backoff_max_seconds),
                paged=kind in _MIRRORED,
            )
            for kind in WATCHED
        ]
        threads = [
            threading.Thread(target=self._guarded, args=(r.run,), name=f"ipamgc-watch-{r.kind}", daemon=True)
            for r in reflectors
        ]
        threads.append(
            threading.Thread(
                target=self._guarded, args=(self._resync_loop,), name="ipamgc-resync", daemon=True
            )
        )
        threads.append(
            threading.Thread(
                target=self._guarded, args=(self.kubevirt.run,), name="ipamgc-kubevirt", daemon=True
            )
        )
        for t in threads:
            t.start()
        try:
            self._publish_loop()
        finally:
            self.stop()
            for r in reflectors:
                r.interrupt()
            self.kubevirt.interrupt()
            for t in threads:
                t.join(timeout=10)
            log.info("stopped publishing", extra={"stats": self.stats.snapshot()})

    def _guarded(self, target: Callable[[], None]) -> None:
        """A thread that dies of a bug takes the watcher down (a half-watching mirror would go stale)."""
        try:
            target()
        except Exception:  # the thread boundary: log it, stop, let the supervisor restart us
            log.exception("%s died; stopping", threading.current_thread().name)
            self._crashed = True
            self.stop()

    def _start_mirror(self) -> None:
        self.mirror.ensure_layout()
        self.mirror.migrate_layout()
        self.mirror.mark_synced(False)
        self.mirror.kubevirt.reset()  # the VM rule waits for this process's own lists of VMs and VMIs
        self.mirror.set_ip_cooldown(None)  # an earlier watcher's value: the leader reads live until ours

    def _put(self, item: Item | KubeVirtServed) -> None:
        """The reflectors' sink: waits while `queue_size` items are pending (back-pressure), gives up
        when stopping."""
        limit = self.settings.queue_size
        weight = _weight(item) if isinstance(item, ListPage) else 0
        with self._room:
            while len(self._items) >= limit or (weight and self._paged >= limit):
                if self._stop.is_set():
                    return
                self._room.wait(0.05)  # woken by `_take`; the timeout only to notice a stop
            self._paged += weight
        self._items.append(item)
        if not self._has_items.is_set():
            self._has_items.set()
        # A list's pages and its end are taken at once, not after the batch window: a cold start (or a
        # relist) is mirrored as it arrives and declared synced when its last list ends, not up to one
        # window later (at 10k pods the window was half of the time to the sync).
        if (
            isinstance(item, ListPage | Listed)
            or len(self._items) >= self.settings.batch_size
            or self._paged >= limit
        ):
            self._full.set()

    # -- the publisher -----------------------------------------------------------------------------------

    def _retrying_redis(self, step: Callable[[], object]) -> bool:
        """Run `step` until it gets through Redis (back-off between tries); False if stopped first."""
        backoff = Backoff(self.settings.backoff_base_seconds, self.settings.backoff_max_seconds)
        while not self._stop.is_set():
            try:
                step()
                return True
            except redis.RedisError as exc:
                delay = backoff.next()
                self.stats.add("redis_errors")
                log.warning("Redis: %s; retrying in %.1fs", exc, delay, extra={"prefix": self.keys.prefix})
                self._stop.wait(delay)
        return False

    def _publish_loop(self) -> None:
        interval = self.settings.kick_interval_seconds
        next_kick = time.monotonic() + interval
        while not self._stop.is_set():
            self.progress_at = time.monotonic()
            batch = self._take(max(0.0, next_kick - time.monotonic()))
            # A batch that failed on Redis is applied again whole: every mirror write is idempotent.
            if batch and not self._retrying_redis(functools.partial(self._apply, batch)):
                return
            if self.synced.is_set() and time.monotonic() >= next_kick:
                # One round trip: the kick reads the `synced` marker with its scripts (`_check_mirror`).
                if not self._retrying_redis(self._kick) or self._mirror_lost:
                    return
                self.stats.add("kicks")
            if time.monotonic() >= next_kick:
                next_kick = time.monotonic() + interval

    def _kick(self) -> None:
        if self.mirror.kick(require=STATE_SYNCED) is None:
            self._lost()

    def _check_mirror(self) -> None:
        """Redis restarted empty (or was flushed) under us: what we publish lands on a partial mirror and
        nothing is decided until every kind is listed again.  Stop; the restarted watcher relists.  Told
        by the `synced` field once synced, by the `listing` marker before (shared/keys.py)."""
        field = STATE_SYNCED if self.synced.is_set() else STATE_LISTING
        if self.mirror.redis.hget(self.keys.state, field) is None:
            self._lost()

    def _lost(self) -> None:
        log.error("the mirror is gone from Redis (restarted empty or flushed): exiting to relist")
        self._mirror_lost = True
        self.stop()

    def _take(self, timeout: float) -> list[Item | KubeVirtServed]:
        """Up to `batch_size` items, waiting at most `batch_wait_seconds` after the first (Calico's
        ProcessBatch).  The window is slept through in one wait, ended early by `_put` when the batch is
        full (never woken per item)."""
        if not self._items and not self._has_items.wait(timeout):
            return []
        limit = self.settings.batch_size
        deadline = time.monotonic() + self.settings.batch_wait_seconds
        full = self.settings.queue_size
        while len(self._items) < limit and self._paged < full and (left := deadline - time.monotonic()) > 0:
            if self._stop.is_set() or self._full.wait(left):  # set since the last take: take now
                break
        # Cleared before the items are taken: a `_put` from here on sets it again for the next take.
        self._full.clear()
        self._has_items.clear()
        items: list[Item | KubeVirtServed] = []
        taken = 0
        while self._items and len(items) < limit:
            item = self._items.popleft()
            items.append(item)
            if isinstance(item, ListPage):
                taken += _weight(item)  # as `_put` counted it
        if items:
            with self._room:
                self._paged -= taken
                self._room.notify_all()
        if self._items:
            self._has_items.set()
        return items

    def _apply(self, items: list[Item | KubeVirtServed]) -> None:
        """Apply a batch in order: events merged per kind (last state wins), relists as barriers."""
        pending: dict[Kind, dict[str, object | None]] = {}
        progress: dict[Kind, str] = {}
        changed = False
        for item in items:
            if self._stop.is_set():
                return  # stopped (perhaps the lease is lost): publish nothing more
            if isinstance(item, ListPage):
                changed = True
                self._flush(pending)
                self._list_page(item)
            elif isinstance(item, Listed):
                changed = True
                self._flush(pending)
                self._relisted(item)
                progress[item.kind] = item.resource_version
            elif isinstance(item, Changed):
                changed = True
                pending.setdefault(item.kind, {})[item.key] = item.obj
                progress[item.kind] = item.resource_version
            elif isinstance(item, Progress):
                progress[item.kind] = item.resource_version
            elif isinstance(item, KubeVirtServed):
                changed = True
                self._flush(pending)
                self.mirror.kubevirt.set_installed(item.served)
        self._flush(pending)
        self._configure()
        if changed and self.synced.is_set():
            if self.settings.full_scan:
                # The benchmark's baseline (Settings.full_scan): every sync re-validates everything.
                self.mirror.mark_all_dirty(self.settings.resync_chunk)
                self.stats.add("full_scans")
            elif self.settings.per_node:
                self._per_node_pass()
        self.mirror.touched_nodes.clear()
        self.mirror.nodes_deleted = False
        self.applied_rv.update(progress)
        self.stats.add("batches")

    def _flush(self, pending: dict[Kind, dict[str, object | None]]) -> None:
        m = self.mirror
        with m.batch():  # one pipeline for the batch's nodes, blocks and pods
            nodes = pending.pop(Kind.NODES, {})
            m.apply_nodes([o for o in nodes.values() if isinstance(o, Node)])
            m.delete_nodes([k for k, o in nodes.items() if o is None])
            blocks = pending.pop(Kind.BLOCKS, {})
            m.apply_blocks([o for o in blocks.values() if isinstance(o, (IPAMBlock, MirroredBlock))])
            for cidr in (k for k, o in blocks.items() if o is None):
                m.delete_block(cidr)
            pods = pending.pop(Kind.PODS, {})
            m.apply_pods([o for o in pods.values() if isinstance(o, Pod)])
            deleted = [k.split("/", 1) for k, o in pods.items() if o is None]
            m.delete_pods((ns, name) for ns, name in deleted)
            for kind in KUBEVIRT_KINDS:
                objs = pending.pop(kind, {})
                m.kubevirt.apply(kind, [o for o in objs.values() if o is not None])
                m.kubevirt.delete(kind, [key for key, o in objs.items() if o is None])
        for key, obj in pending.pop(Kind.CONTROLLERS_CONFIG, {}).items():
            if obj is None:
                self._kcc.pop(key, None)
            elif isinstance(obj, ControllersConfig):
                self._kcc[key] = obj
        for key, obj in pending.pop(Kind.CLUSTER_INFO, {}).items():
            if key == "default":
                self._cluster_info(obj if isinstance(obj, ClusterInfo) else None)
        for key, obj in pending.pop(Kind.IPAM_CONFIG, {}).items():
            if obj is None:
                self._ipam_configs.pop(key, None)
            elif isinstance(obj, IpamConfigObject):
                self._ipam_configs[key] = obj.config

    def _per_node_pass(self) -> None:
        """The benchmark's `per-node` baseline (Settings.per_node): one pass of Calico 3.30–3.33's
        `syncIPAM` after a batch (spec §5): a node deletion makes it a full scan, else every allocation of
        every node the batch touched is re-validated; and every pass walks every block and allocation
        (its metrics) and every empty block, as Calico's does."""
        m = self.mirror
        if m.nodes_deleted:
            m.mark_all_dirty(self.settings.resync_chunk)
            self.stats.add("full_scans")
        elif m.touched_nodes:
            m.dirty_nodes(sorted(m.touched_nodes))
        blocks, allocations, empty = m.walk_blocks()
        self.stats.add("per_node_passes")
        self.stats.add("per_node_walked_allocations", n=allocations)
        self.stats.add("per_node_walked_blocks", n=blocks + empty)

    def _list_page(self, item: ListPage) -> None:
        kind = item.kind
        if item.first or kind not in self._relists:
            self._relists[kind] = self.mirror.begin_relist(_MIRRORED[kind])
        self._relists[kind].page(item.objects)

    def _relisted(self, item: Listed) -> None:
        kind = item.kind
        if kind in _MIRRORED and item.paged:
            session = self._relists.pop(kind, None) or self.mirror.begin_relist(_MIRRORED[kind])
            session.page(item.objects)
            session.finish(item.keep)
        elif kind in _MIRRORED:
            self.mirror.relist(_MIRRORED[kind], item.objects, keep=item.keep)
        elif kind in KUBEVIRT_KINDS:
            self.mirror.kubevirt.relist(kind, item.objects, item.keep)
        elif kind is Kind.CONTROLLERS_CONFIG:
            self._kcc = {o.name: o for o in item.objects if isinstance(o, ControllersConfig)}
        elif kind is Kind.IPAM_CONFIG:
            self._ipam_configs = {o.name: o.config for o in item.objects if isinstance(o, IpamConfigObject)}
        elif kind is Kind.CLUSTER_INFO:
            infos = {o.name: o for o in item.objects if isinstance(o, ClusterInfo)}
            if "default" in infos:
                self._cluster_info(infos["default"])
            elif self._ci_seen or item.keep is None:
                self._cluster_info(None)  # deleted while we were not watching, or unidentifiable
        if kind in self._listed:
            self.stats.add("relists", kind)
        self._listed.add(kind)

    def _cluster_info(self, info: ClusterInfo | None) -> None:
        """Calico: datastoreReady = spec.datastoreReady when set (else unchanged); deleted ⇒ false."""
        if info is None:
            self._ready = False
            return
        self._ci_seen = True
        if info.datastore_ready is not None:
            self._ready = info.datastore_ready

    def _grace(self) -> float | None:
        override = self.settings.leak_grace_override
        if override is not None:
            return override.seconds
        kcc = self._kcc.get("default")
        return self.settings.default_leak_grace_seconds if kcc is None else kcc.leak_grace

    def _configure(self) -> None:
        """Write the configuration once both config kinds are listed; mark synced once everything is
        (but the IPAMConfig, whose cooldown is written on its own once listed: `SYNC_GATED`)."""
        if Kind.IPAM_CONFIG in self._listed:
            cooldown = self._ipam_configs.get(CONFIG_NAME, DEFAULT).ip_cooldown_seconds
            if cooldown != self._cooldown:
                log.info("configuration: IP cooldown %s s", cooldown)
                self.mirror.set_ip_cooldown(cooldown)
                self._cooldown = cooldown
        if not {Kind.CONTROLLERS_CONFIG, Kind.CLUSTER_INFO} <= self._listed:
            return
        config = (self._grace(), self._ready)
        if config != self._config:
            log.info("configuration: leak grace period %s s, datastore ready %s", *config)
            self.mirror.set_config(*config)
            self._config = config
            self._resync_now.set()  # the resync period follows the grace period
        if not self.synced.is_set() and set(SYNC_GATED) <= self._listed:
            self._check_mirror()  # Redis lost what was listed before: never call that mirror synced
            if self._mirror_lost:
                return
            self.mirror.mark_synced(True)
            self.synced.set()
            # The mirror's memory (~5 objects per allocation) lives as long as the process: take it out of
            # the cyclic collector's view, which would otherwise walk all of it in every full collection.
            gc.collect()
            gc.freeze()
            log.info("initial lists mirrored: validation may start", extra={"stats": self.stats.snapshot()})

    # -- the resync ----------------------------------------------------------------------------------------

    def _resync_loop(self) -> None:
        while not self.synced.wait(0.2):
            if self._stop.is_set():
                return
        last = time.monotonic()
        while not self._stop.is_set():
            grace = self._config[0] if self._config is not None else None
            due = last + self.settings.resync_period(grace)
            if self._resync_now.wait(max(0.0, due - time.monotonic())):
                self._resync_now.clear()
            if self._stop.is_set():
                return
            if not self._resync_wanted and time.monotonic() < due:
                continue  # woken by a new grace period: the period is computed again
            self._resync_wanted = False
            try:
                added = self.mirror.mark_all_dirty(self.settings.resync_chunk, pause=self._resync_pause)
            except _Stopping:
                return
            except redis.RedisError as exc:
                log.warning("resync failed, retrying at the next period: %s", exc)
                added = 0
            last = time.monotonic()
            self.stats.add("resyncs")
            log.info("full resync: %d allocations newly dirty", added)

    def _resync_pause(self) -> None:
        if self._stop.wait(self.settings.resync_pause_seconds):
            raise _Stopping


@contextlib.contextmanager
def open_watcher(settings: Settings, *, clock: Clock | None = None) -> Iterator[Watcher]:
    """A Watcher on clients built from `settings`, closed on exit."""
    api = api_client(settings.kubeconfig, settings.kube_context)
    try:
        client = redis_client(settings.redis_url)
        try:
            yield Watcher(settings, api, client, clock=clock)
        finally:
            client.close()
    finally:
        api.close()  # type: ignore[no-untyped-call]


# What a pending list object weighs against `queue_size`: an IPAMBlock as 8, anything else 1.  A /26 block
# is ~13 KB of JSON (64 attributes), a pod 0.4–6 KB; the decoded blocks of a pending page hold views into
# it.  With `queue_size` 10,000: ~1,250 blocks (two or three pages of ~4 MB) pending at most, against
# 10,000 (twenty) when a block counted as one; at 10k pods every block fits in, as before.
BLOCK_WEIGHT = 8


def _weight(page: ListPage) -> int:
    return len(page.objects) * (BLOCK_WEIGHT if page.kind is Kind.BLOCKS else 1)
