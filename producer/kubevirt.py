"""KubeVirt in the watcher: notice when kubevirt.io/v1 is served, watch VMs and VMIs then, mirror them slim.

Why a module: KubeVirt is optional and may be installed (or removed) while ipamgc runs.  Calico ≥ 3.32
polls discovery every 30 s until KubeVirt is there, then starts VM and VMI informers (`DeferredInformers`);
until they have synced, its VM rule keeps every VM allocation (§3.8).  Here:

- `discover` asks the API server for `/apis/kubevirt.io/v1` (one small GET): VMs and VMIs served → True,
  404 → False, anything else → None (unknown: nothing changes);
- `KubeVirtWatch` (a watcher thread) runs that every `kubevirt_discovery_seconds`, and while kubevirt.io/v1
  is served runs one `Reflector` per kind (list, watch, relist after 410, back off) into the watcher's
  hand-off; when KubeVirt stops being served it stops them and hands off `KubeVirtServed(False)`;
- `KubeVirtMirror` (the publisher's side) keeps `P:vms` and `P:vmis` and dirties exactly the VM allocations
  an event can change: those whose `namespace`/`vmi-name` name the VM (the watcher's `vm_allocs` index), and
  only when the VM appears or goes, or (no VM of that name mirrored) the VMI appears, goes or changes owner:
  nothing else of either object is read by the rule.  `state.kubevirt` is set once the first lists of both
  kinds are mirrored (every VM allocation dirtied then: the rule now applies) and removed when KubeVirt
  goes (every VM allocation dirtied again: kept, `kubevirt-absent`).  Per event: O(change), no reads from
  Redis, writes in the batch's pipeline.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import orjson
import redis

from kubeio.client import ApiClient
from kubeio.errors import translate
from kubeio.http import ApiError, Http
from kubeio.watch import Backoff
from producer.kinds import Kind
from producer.kube import KubeApi
from producer.memory import Memory
from producer.reflector import Item, Reflector, WatchStats
from producer.writes import Writes
from shared import keys as k
from shared import kubevirt as kv
from shared.records import encode_vm, encode_vmi


class Mirror(Protocol):
    """`producer.mirror.Mirror` as the VM mirror uses it (its memory, its batch writes and their send):
    an interface, so that this module does not import the one that imports it."""

    redis: redis.Redis
    keys: k.Keys
    memory: Memory

    def _memory(self) -> Memory: ...

    def _writes(self) -> Writes: ...

    def _send(self, writes: Writes) -> int: ...


log = logging.getLogger(__name__)

KINDS = (Kind.VMS, Kind.VMIS)


@dataclass(frozen=True, slots=True)
class KubeVirtServed:
    """Handed off when discovery finds kubevirt.io/v1 no longer served (its reflectors are stopped)."""

    served: bool


def discover(api: ApiClient, timeout: float = 10.0) -> bool | None:
    """Whether the API server serves kubevirt.io/v1 VMs and VMIs (`GET /apis/kubevirt.io/v1`, a short
    resource list): True, False (404, or either resource missing), None when it cannot tell."""
    path = f"/apis/{kv.KUBEVIRT_GROUP}/{kv.KUBEVIRT_VERSION}"
    try:
        what = "discover kubevirt.io/v1"
        body = orjson.loads(Http(api).request("GET", path, what=what, timeout=(timeout, timeout)))
    except ApiError as exc:
        if exc.status == 404:
            return False
        log.warning("KubeVirt discovery: %s", translate(exc, "discover kubevirt.io/v1"))
        return None
    except orjson.JSONDecodeError as exc:
        log.warning("KubeVirt discovery: %s", translate(exc, "discover kubevirt.io/v1"))
        return None
    resources = body.get("resources") if isinstance(body, dict) else None
    if not isinstance(resources, list):
        return None
    names = {r.get("name") for r in resources if isinstance(r, dict)}
    return {kv.VMS, kv.VMIS} <= names


class KubeVirtWatch:
    """Discovery, and the VM and VMI reflectors while kubevirt.io/v1 is served (see the module docstring)."""

    def __init__(
        self,
        client: ApiClient,
        api: KubeApi,
        sink: Callable[[Item | KubeVirtServed], None],
        stats: WatchStats,
        stop: threading.Event,
        backoff: Callable[[], Backoff],
        interval: float,
        guard: Callable[[Callable[[], None]], None],
        discovery: Callable[[ApiClient], bool | None] = discover,
    ) -> None:
        self.client = client
        self.api = api
        self.sink = sink
        self.stats = stats
        self.stop = stop
        self.backoff = backoff
        self.interval = interval
        self.discovery = discovery
        self.guard = guard  # runs a thread's target; a bug in it stops the watcher (`Watcher._guarded`)
        self._reflectors: list[Reflector] = []
        self._threads: list[threading.Thread] = []
        self._stop_reflectors = threading.Event()

    @property
    def running(self) -> bool:
        return bool(self._threads)

    def run(self) -> None:
        first = True
        try:
            while not self.stop.is_set():
                served = self.discovery(self.client)
                self.stats.add("kubevirt_discoveries")
                if served is True and not self.running:
                    log.info("kubevirt.io/v1 is served: watching VirtualMachines and VirtualMachineInstances")
                    self._start()
                elif served is False and (self.running or first):
                    if self.running:
                        log.info("kubevirt.io/v1 is no longer served: the VM rule keeps every VM allocation")
                    self._halt()
                    self.sink(KubeVirtServed(False))  # also drops what an earlier watcher mirrored
                if served is not None:
                    first = False
                self.stop.wait(self.interval)
        finally:
            self._halt()

    def interrupt(self) -> None:
        for r in self._reflectors:
            r.interrupt()

    def _start(self) -> None:
        self._stop_reflectors = threading.Event()
        for kind in KINDS:
            r = Reflector(self.api, kind, self.sink, self.stats, self._stop_reflectors, self.backoff())
            t = threading.Thread(target=self.guard, args=(r.run,), name=f"ipamgc-watch-{kind}", daemon=True)
            self._reflectors.append(r)
            self._threads.append(t)
            t.start()

    def _halt(self) -> None:
        self._stop_reflectors.set()
        for r in self._reflectors:
            r.interrupt()
        for t in self._threads:
            t.join(timeout=10)
        self._reflectors, self._threads = [], []


class KubeVirtMirror:
    """`P:vms`, `P:vmis` and `state.kubevirt`, kept by the publisher (see the module docstring)."""

    def __init__(self, mirror: Mirror) -> None:
        self.mirror = mirror
        self.installed = False  # `state.kubevirt` as this watcher last wrote it
        self._listed: set[Kind] = set()

    # -- events --------------------------------------------------------------------------------------------

    def apply(self, kind: Kind, objects: Iterable[object]) -> None:
        """VM or VMI add/update events (the last state of each)."""
        m = self.mirror
        mem = m._memory()
        table, key = (mem.vms, m.keys.vms) if kind is Kind.VMS else (mem.vmis, m.keys.vmis)
        writes = m._writes()
        for obj in objects:
            if isinstance(obj, kv.VirtualMachine) and kind is Kind.VMS:
                record = encode_vm(obj)
            elif isinstance(obj, kv.VirtualMachineInstance) and kind is Kind.VMIS:
                record = encode_vmi(obj)
            else:
                raise TypeError(f"{kind}: {type(obj).__name__} is not a KubeVirt object of that kind")
            name = obj.key
            before = table.get(name)
            if before == record:
                continue
            table[name] = record
            writes.base_set(key, name, record)
            if kind is Kind.VMS and before is not None:
                continue  # the VM existed and still does: nothing the rule reads changed
            if kind is Kind.VMIS and name in mem.vms:
                continue  # the VM exists: the rule does not look at its VMI
            self._dirty(writes, name)
        m._send(writes)

    def delete(self, kind: Kind, names: Iterable[str]) -> None:
        """VM or VMI deletions (`<ns>/<name>`); one that was mirrored dirties the VM allocations naming it."""
        m = self.mirror
        mem = m._memory()
        table, key = (mem.vms, m.keys.vms) if kind is Kind.VMS else (mem.vmis, m.keys.vmis)
        writes = m._writes()
        for name in names:
            if table.pop(name, None) is None:
                continue
            writes.base_del(key, name)
            if kind is Kind.VMIS and name in mem.vms:
                continue  # the VM exists: the rule does not look at its VMI
            self._dirty(writes, name)
        m._send(writes)

    def relist(self, kind: Kind, objects: Iterable[object], keep: Iterable[str] | None) -> None:
        """A complete list: upsert it, delete what is mirrored and absent (unless kept; None keeps all).
        Once both kinds are listed, the VM rule is switched on.  Not inside `Mirror.batch()`: the records
        must be in Redis before the flag is."""
        fresh = list(objects)
        self.apply(kind, fresh)
        if keep is not None:
            mem = self.mirror._memory()
            table = mem.vms if kind is Kind.VMS else mem.vmis
            seen = {o.key for o in fresh if isinstance(o, (kv.VirtualMachine, kv.VirtualMachineInstance))}
            self.delete(kind, sorted(set(table) - seen - set(keep)))
        self._listed.add(kind)
        if not self.installed and self._listed >= set(KINDS):
            self.set_installed(True)

    def _dirty(self, writes: Writes, name: str) -> None:
        """The VM allocations naming `name` (only while the rule applies: before, they are all valid and
        switching the rule on dirties every one)."""
        if not self.installed:
            return
        mem = self.mirror.memory
        for alloc_id, shard in mem.owned(mem.vm_allocs, name):
            writes.mark_dirty(shard, (alloc_id,))

    # -- the VM rule on and off --------------------------------------------------------------------------

    def set_installed(self, installed: bool) -> None:
        """Switch the VM rule on (both kinds listed) or off (KubeVirt gone: the mirrored objects go too);
        every VM allocation is dirtied."""
        m = self.mirror
        mem = m._memory()
        if not installed:
            self._listed.clear()
            # The flag goes first: no worker reads a half-deleted mirror as authoritative.
            m.redis.hdel(m.keys.state, k.STATE_KUBEVIRT)
            m.redis.delete(m.keys.vms, m.keys.vmis)
            mem.vms.clear()
            mem.vmis.clear()
        if installed:
            m.redis.hset(m.keys.state, k.STATE_KUBEVIRT, "1")  # after the records (sent by `relist`)
        writes = m._writes()
        for key in mem.vm_allocs:
            for alloc_id, shard in mem.owned(mem.vm_allocs, key):
                writes.mark_dirty(shard, (alloc_id,))
        self.installed = installed
        m._send(writes)
        log.info("VM rule %s", "on: VMs and VMIs mirrored" if installed else "off (KubeVirt not served)")

    def reset(self) -> None:
        """At the watcher's start: the rule is off until this process has listed VMs and VMIs itself."""
        self._listed.clear()
        self.installed = False
        self.mirror.redis.hdel(self.mirror.keys.state, k.STATE_KUBEVIRT)


__all__ = ["KINDS", "KubeVirtMirror", "KubeVirtServed", "KubeVirtWatch", "discover"]
