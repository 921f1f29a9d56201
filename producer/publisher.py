"""The watcher's publisher: applies the reflectors' batches to the `Mirror`, derives the configuration,
and decides when the mirror is synced.

Why a module: this is the single-threaded decision half of the watcher, apart from the threads, the
Lease and the timers (`producer/watcher.py`), so that what a batch does to the mirror reads in one place.
A batch is applied in order: each kind's events merged (the last state of an object wins), a list page or
a list's end a barrier; configuration objects (KubeControllersConfiguration, ClusterInformation,
IPAMConfig) are kept here and written with `Mirror.set_config` / `Mirror.set_ip_cooldown` once listed;
the mirror is marked synced once the first list of every kind is in (nothing is decided before).  Only
the publisher thread calls it; the resync thread reads `configured_grace`.
"""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Callable

from producer.kinds import SYNC_GATED, Kind
from producer.kubevirt import KINDS as KUBEVIRT_KINDS
from producer.kubevirt import KubeVirtServed
from producer.mirror import Mirror
from producer.reflector import Changed, Item, Listed, ListPage, Progress, WatchStats
from producer.relist import Kind as MirrorKind
from producer.relist import Relist
from producer.typed import ClusterInfo, ControllersConfig, IpamConfigObject
from shared.blockrecords import MirroredBlock
from shared.config import Settings
from shared.ipamconfig import CONFIG_NAME, DEFAULT, IPAMConfig
from shared.keys import STATE_LISTING, STATE_SYNCED
from shared.model import IPAMBlock, Node, Pod

log = logging.getLogger(__name__)

# The kinds the Mirror keeps (listed page by page); the others are configuration or KubeVirt's.
MIRRORED = {Kind.NODES: MirrorKind.NODES, Kind.PODS: MirrorKind.PODS, Kind.BLOCKS: MirrorKind.BLOCKS}


class Publisher:
    """Applies batches to `mirror` (see the module docstring).  `on_config_changed` is called when the
    leak grace period or readiness changed (the resync period follows it); `on_lost` when Redis lost the
    mirror before it was marked synced."""

    def __init__(
        self,
        settings: Settings,
        mirror: Mirror,
        stats: WatchStats,
        stop: threading.Event,
        synced: threading.Event,
        *,
        on_config_changed: Callable[[], None],
        on_lost: Callable[[], None],
    ) -> None:
        self.settings = settings
        self.keys = settings.keys
        self.mirror = mirror
        self.stats = stats
        self._stop = stop
        self.synced = synced
        self._on_config_changed = on_config_changed
        self._on_lost = on_lost
        self._listed: set[Kind] = set()
        self._kcc: dict[str, ControllersConfig] = {}
        self._ready = True  # Calico starts with datastoreReady = true
        self._ci_seen = False
        self._config: tuple[float | None, bool] | None = None
        self._ipam_configs: dict[str, IPAMConfig] = {}
        self._cooldown: int | None = None  # as last written to the mirror
        self._relists: dict[Kind, Relist] = {}
        self.applied_rv: dict[Kind, str] = {}

    @property
    def configured_grace(self) -> float | None:
        """The leak grace period as last written to the mirror (None: unset, or not written yet)."""
        return self._config[0] if self._config is not None else None

    def apply(self, items: list[Item | KubeVirtServed]) -> None:
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
            self._relists[kind] = self.mirror.begin_relist(MIRRORED[kind])
        self._relists[kind].page(item.objects)

    def _relisted(self, item: Listed) -> None:
        kind = item.kind
        if kind in MIRRORED and item.paged:
            session = self._relists.pop(kind, None) or self.mirror.begin_relist(MIRRORED[kind])
            session.page(item.objects)
            session.finish(item.keep)
        elif kind in MIRRORED:
            self.mirror.relist(MIRRORED[kind], item.objects, keep=item.keep)
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
            self._on_config_changed()  # the resync period follows the grace period
        if not self.synced.is_set() and set(SYNC_GATED) <= self._listed:
            if not self._check_mirror():  # Redis lost what was listed before: never call that mirror synced
                return
            self.mirror.mark_synced(True)
            self.synced.set()
            # The mirror's memory (~5 objects per allocation) lives as long as the process: take it out of
            # the cyclic collector's view, which would otherwise walk all of it in every full collection.
            gc.collect()
            gc.freeze()
            log.info("initial lists mirrored: validation may start", extra={"stats": self.stats.snapshot()})

    def _check_mirror(self) -> bool:
        """Redis restarted empty (or was flushed) under us: what we publish lands on a partial mirror and
        nothing is decided until every kind is listed again.  Stop (`on_lost`, False); the restarted
        watcher relists.  Told by the `synced` field once synced, by the `listing` marker before
        (shared/keys.py)."""
        field = STATE_SYNCED if self.synced.is_set() else STATE_LISTING
        if self.mirror.redis.hget(self.keys.state, field) is None:
            self._on_lost()
            return False
        return True
