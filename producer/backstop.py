"""The watcher's periodic backstop: what a full resync was for, found by the cheapest sufficient means.

Why a module: the full resync (every allocation dirty, every one re-validated by the workers every leak
grace period / 2) cost about what Calico's full scan does (issue 48), although every change is tracked
exactly.  What it exists to catch in ipamgc, and what catches each here instead:

1. **A dirty mark lost, or a bug in dirty tracking** (an event that changed what a verdict reads without
   dirtying the allocation; a `dirty:{s}` entry, a leak timer or a decision lost with Redis): the
   *sweep* (`unheld`) walks the watcher's own memory and dirties every allocation that is not plainly
   held: a pod allocation whose pod is mirrored and reports the allocation's IP is valid under every rule
   (`shared/allocrules.py`: the IP in the pod's reported IPs is valid on either branch, the node's
   existence aside), a VM allocation whose VM is mirrored is valid, an allocation with no owner
   attributes or the Windows handle is valid, a tunnel IP is valid while its node is.  Everything else
   (pod gone, IP not reported, no IP yet, VM gone, node gone) is re-validated by the workers, with the
   rules, exactly as the full resync did.  So every allocation the full resync could have found invalid
   is re-validated each period; the ones it re-validated only to find them valid again are not.
2. **A mirror record changed behind the watcher's back** (Redis failing over to a replica that missed the
   last writes, restarting from an older file, an operator's `redis-cli`): the *audit* (`audit`) reads the
   records the rules read (`P:pods`, `P:nodes`, `P:blocks`) and compares each with what the watcher
   remembers writing (a pod by its fingerprint, a node and a block by their bytes).  A record that
   differs, is missing or is extra is taken into memory as Redis holds it (`Memory.adopt_*`) and its kind
   relisted: the relist's diff then writes exactly what Redis lacks and dirties what it changes, as after
   a batch cut off half-way.  The full resync caught none of these: it re-validated against the stale
   record.
3. **A rule whose inputs change with time alone**: none is left to a period.  A leak timer is a due time
   (`due:{s}`) that wakes the watcher's kick; a grace period or readiness change dirties everything
   (`producer/statehash.py`), as before.
4. **A watch event the watcher never saw**: neither the full resync nor Calico's scan of its informer
   cache can see one (both re-read what the watch delivered); a relist can.  The reflector relists on a
   410 and on every watch error, as client-go's does; the audit's relists come on top.  A lost pod
   delete keeps the IP (the pod seems to run); a lost pod add cannot release one (the leader's live
   re-check finds the pod).

Both run on the publisher thread (the memory is the publisher's alone) when the resync thread says a
period has passed (`producer/resync.py`); `--backstop full` keeps the full resync.  Nothing here decides a
release: the workers' rules, the leader's live re-check and its conditional writes are unchanged.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar, cast

import redis

from producer.allocaudit import forget_blocks_missing_records
from producer.heldips import V6
from producer.memory import HeldBlock, Memory, PodEntry, refs
from producer.mirror import Mirror
from producer.reflector import WatchStats
from producer.relist import Kind as MirrorKind
from shared.blockrecords import BLOCK_SCAN_COUNT, encode_block_packed
from shared.keys import STATE_LAST_FULL_RESYNC
from shared.netaddr import AddressError, parse_network

log = logging.getLogger(__name__)

T = TypeVar("T")

AUDIT_COUNT = 5000  # fields per HSCAN (and HMGET) of the audit: ~0.5 MB of pod records a reply
# Passes that read a whole mirrored hash between them (`HashAudit`): at the default period a record
# changed in place behind the watcher's back is found within half an hour; one added or removed, or any
# loss Redis's write generation shows (`producer/generation.py`), at the next pass or kick.  Reading every
# record each pass made a pass at 150,000 pods 0.87 CPU s, a quarter 0.29 (docs/benchmarks.md).
AUDIT_SLICES = 4
SEND_CHUNK = 5000  # allocation ids dirtied per pipeline


@dataclass(slots=True)
class Unheld:
    """What a sweep found to re-validate: allocation refs (block CIDR, ordinal, shard) and gone nodes."""

    refs: list[tuple[str, int, int]] = field(default_factory=list)
    gone_nodes: list[str] = field(default_factory=list)
    walked: int = 0  # allocations looked at


def unheld(memory: Memory) -> Unheld:
    """Every allocation the watcher's memory cannot show valid (the sweep; see the module docstring)."""
    out = Unheld()
    vm_refs: set[tuple[str, int]] = set()
    for key, flat in memory.vm_allocs.items():
        vm_held = key in memory.vms
        for ref in refs(flat):
            vm_refs.add((ref[0], ref[1]))
            out.walked += 1
            if not vm_held:
                out.refs.append(ref)
    bases: dict[str, int | None] = {}
    base_of = bases.get
    pod_of = memory.pods.get
    walked = 0
    for key, flat in memory.pod_allocs.items():
        entry = pod_of(key)
        ips = entry[2] if entry is not None else None
        if len(flat) == 3 and type(ips) is int:  # the common case: one IP, one allocation
            cidr = flat[0]
            base = base_of(cidr, -1)  # type: ignore[arg-type]
            if base == -1:
                base = bases[cidr] = _base(cast(str, cidr))  # type: ignore[index]
            if base is not None and base + flat[1] == ips:  # type: ignore[operator]
                walked += 1
                continue
        for cidr, ordinal, shard in refs(flat):
            walked += 1
            if ips is not None:
                base = bases.get(cidr, -1)
                if base == -1:
                    base = bases[cidr] = _base(cidr)
                if base is not None:
                    n = base + ordinal
                    if n == ips if isinstance(ips, int) else n in ips:
                        continue
            if (cidr, ordinal) not in vm_refs:
                out.refs.append((cidr, ordinal, shard))
    out.walked += walked
    nodes = memory.nodes
    gone: set[str] = set()
    for held in memory.blocks.values():
        for node in held.nodes:
            if node and node not in nodes:
                gone.add(node)
    out.gone_nodes = sorted(gone)
    return out


def _base(cidr: str) -> int | None:
    try:
        net = parse_network(cidr)
    except AddressError:
        return None
    n = int(net.network_address)
    return n | V6 if net.version == 6 else n


# -- the audit -----------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Divergence:
    """Records of one kind whose Redis copy is not what the watcher wrote: field → Redis's bytes (None:
    absent from Redis)."""

    differ: dict[str, bytes | None] = field(default_factory=dict)
    scanned: int = 0
    matched: int = 0

    def __bool__(self) -> bool:
        return bool(self.differ)


class HashAudit:
    """One mirrored hash (`key`), audited a slice per pass: `AUDIT_SLICES` passes read all of it, the
    HSCAN cursor kept from one pass to the next.  Whole, at once, when its length is not what the
    watcher holds (a record added or removed behind its back) or a slice found a record not as written
    (what else changed is then looked for too, a record missing from Redis included)."""

    def __init__(self, key: str, slices: int = 0, count: int = AUDIT_COUNT) -> None:
        self.key = key
        self.slices = slices or AUDIT_SLICES
        self.count = count  # fields per HSCAN: fewer for a hash of large records (`BLOCK_SCAN_COUNT`)
        self.cursor = 0

    def run(self, client: redis.Redis, held: Mapping[str, T], same: Callable[[T, bytes], bool]) -> Divergence:
        """`same(entry, data)`: whether Redis's bytes are what the watcher wrote for `entry`."""
        if int(client.hlen(self.key)) == len(held):
            out = self._scan(client, held, same, -(-len(held) // self.slices))
            if not out:
                return out
        self.cursor = 0
        out = self._scan(client, held, same, None)
        self.cursor = 0
        if out.matched + sum(1 for n in out.differ if n in held) != len(held):  # HSCAN may repeat a field
            names = list(held)
            for i in range(0, len(names), AUDIT_COUNT):
                part = names[i : i + AUDIT_COUNT]
                for name, present in zip(part, client.hmget(self.key, part), strict=True):
                    if present is None:
                        out.differ[name] = None
        return out

    def _scan(
        self, client: redis.Redis, held: Mapping[str, T], same: Callable[[T, bytes], bool], budget: int | None
    ) -> Divergence:
        """From the kept cursor, at least `budget` fields (None: to the end of the hash)."""
        out = Divergence()
        get = held.get
        cursor = self.cursor
        while True:
            count = self.count if budget is None else max(1, min(self.count, budget - out.scanned))
            cursor, reply = client.hscan(self.key, cursor, count=count)
            chunk = cast(dict[bytes, bytes], reply)  # a client of `CLIENT_OPTIONS`: bytes, field → value
            out.scanned += len(chunk)
            for raw, data in chunk.items():
                name = raw.decode(errors="replace")
                entry = get(name)
                if entry is None or not same(entry, data):
                    out.differ[name] = data
                else:
                    out.matched += 1
            if not cursor or (budget is not None and out.scanned >= budget):
                break
        self.cursor = int(cursor)
        return out


# -- the pass ------------------------------------------------------------------------------------------------


class Backstop:
    """One backstop pass (`run`, on the publisher thread): the audit, then the sweep, then a kick.
    `relist(kind)` asks that kind's reflector for a relist (the audit's repair)."""

    def __init__(
        self,
        mirror: Mirror,
        stats: WatchStats,
        relist: Callable[[MirrorKind], None],
        *,
        audit_slices: int = AUDIT_SLICES,
    ) -> None:
        self.mirror = mirror
        self.stats = stats
        self.relist = relist
        # Set when Redis lost writes (`producer/generation.py`): the next pass also looks up every held
        # allocation's record (`producer/allocaudit.py`).
        self.after_loss = False
        keys = mirror.keys
        self.audits = {
            MirrorKind.NODES: HashAudit(keys.nodes, audit_slices),
            MirrorKind.BLOCKS: HashAudit(keys.blocks, audit_slices, BLOCK_SCAN_COUNT),
            MirrorKind.PODS: HashAudit(keys.pods, audit_slices),
        }

    def run(self) -> int:
        """The pass; returns how many allocations it newly dirtied."""
        m = self.mirror
        mem = m.held_memory()
        repaired = self._audit(mem)
        if self.after_loss:
            self.after_loss = False
            repaired += self._audit_allocations(mem)
        found = unheld(mem)
        published = 0
        for i in range(0, len(found.refs), SEND_CHUNK):
            writes = m.sender.writes()
            for cidr, ordinal, shard in found.refs[i : i + SEND_CHUNK]:
                alloc_id = mem.alloc_id_at(cidr, ordinal, "the backstop")
                if alloc_id is not None:
                    writes.mark_dirty(shard, (alloc_id,))
            published += m.sender.send(writes)
        if found.gone_nodes:
            published += m.dirty_nodes(found.gone_nodes)
        m.redis.hset(m.keys.state, STATE_LAST_FULL_RESYNC, repr(m.clock.now()))
        m.kick()
        self.stats.add("resyncs")
        self.stats.add("backstop_walked", n=found.walked)
        self.stats.add("backstop_dirtied", n=published)
        log.info(
            "backstop: %d allocations walked, %d not plainly held, %d gone nodes, %d newly dirty; "
            "%d records repaired",
            found.walked,
            len(found.refs),
            len(found.gone_nodes),
            published,
            repaired,
        )
        return published

    def _audit_allocations(self, mem: Memory) -> int:
        """Blocks with an allocation record Redis lost are forgotten and relisted (written whole)."""
        m = self.mirror
        missing = forget_blocks_missing_records(m.redis, m.keys, mem, m.shards)
        if not missing:
            return 0
        self.stats.add("backstop_repairs", str(MirrorKind.BLOCKS), n=len(missing))
        log.warning(
            "backstop: %d blocks hold allocations whose records Redis lost (e.g. %s); relisting blocks",
            len(missing),
            min(missing),
        )
        self.relist(MirrorKind.BLOCKS)
        return len(missing)

    def _audit(self, mem: Memory) -> int:
        m = self.mirror
        client = m.redis

        def block_same(held: HeldBlock, data: bytes) -> bool:
            lean = held.lean
            rec = encode_block_packed(
                lean.resource_version, lean.uid, lean.host, lean.in_use, held.packed, lean.cooling_since
            )
            return rec == data

        def pod_same(entry: PodEntry, data: bytes) -> bool:
            return entry[0] == hash(data)

        checks: list[tuple[MirrorKind, Divergence]] = [
            (MirrorKind.NODES, self.audits[MirrorKind.NODES].run(client, mem.nodes, operator.eq)),
            (MirrorKind.BLOCKS, self.audits[MirrorKind.BLOCKS].run(client, mem.blocks, block_same)),
            (MirrorKind.PODS, self.audits[MirrorKind.PODS].run(client, mem.pods, pod_same)),
        ]
        repaired = 0
        for kind, div in checks:
            if not div:
                continue
            for name, data in div.differ.items():
                if kind is MirrorKind.BLOCKS:
                    if data is None:
                        mem.forget_block(name)
                    else:
                        mem.adopt_block(name, data)
                elif kind is MirrorKind.PODS:
                    if data is None:
                        mem.pods.pop(name, None)
                    else:
                        mem.adopt_pod(name, data)
                elif data is None:
                    mem.nodes.pop(name, None)
                else:
                    mem.adopt_node(name, data)
            n = len(div.differ)
            repaired += n
            self.stats.add("backstop_repairs", str(kind), n=n)
            log.warning(
                "backstop: %d %s records in Redis are not what this watcher wrote (e.g. %s); relisting %s",
                n,
                kind,
                next(iter(div.differ)),
                kind,
            )
            self.relist(kind)
        return repaired
