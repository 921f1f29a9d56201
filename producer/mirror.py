"""The watcher's Redis mirror: keep the state validation reads, and publish exactly what an event dirtied.

The Kubernetes list/watch loop (elsewhere) calls one method per event or batch of events.  Each method
reads what it must compare against (one round trip; a block batch in which allocations vanished reads
their nodes' existence too), then writes the new records, the indexes, the dirty allocation ids and the
"a job is queued" flags in one pipeline; a shard whose flag it newly set gets one `enqueue(shard)` call
(the producer does not import RQ; the entry point wires the callback).  The loop must also call `kick()`
every few seconds (candidates whose grace period ended, expired leases) and `mark_all_dirty()` as the
periodic full resync (Calico: every leak grace period / 2, else 5 minutes).

What dirties what, at allocation granularity (spec §3.3, §3.4, §8.8):
- block: its new allocations, its changed ones (sequence number or GC attributes; the stored record is
  refreshed and the candidate timer reset, #12839) and its vanished ones (also removed from every index,
  timers dropped; if their node is gone, the node's remaining allocations too: its tunnel IPs may now go);
- pod add/change/delete: the allocations whose attributes name the pod (index `podallocs`);
- node add: its allocations; node delete: its allocations and its blocks;
- config change (grace period, datastore readiness): everything.
Allocations without a `node` attribute are kept in the handle index only and never dirtied.  Every write
is idempotent and every add path has its remove path, so replaying or merging events is harmless.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import redis

from producer.redis_scripts import ProducerScripts
from shared import keys as k
from shared.clock import Clock, SystemClock
from shared.codec import RecordError, WrongRecordShape, as_str_map, unpack
from shared.errors import ConfigError
from shared.keys import Keys, handle_field, pod_key
from shared.model import (
    ATTR_NAMESPACE,
    ATTR_NODE,
    ATTR_POD,
    Allocation,
    IPAMBlock,
    Node,
    Pod,
    allocation_id,
    sanitize_handle,
)
from shared.netaddr import AddressError, block_size, ordinal_to_ip, parse_network
from shared.records import (
    BlockRecord,
    Slot,
    block_record,
    decode_block,
    decode_node,
    encode_allocation,
    encode_block,
    encode_node,
    encode_pod,
)
from shared.shard import DEFAULT_SHARDS, shard_of

log = logging.getLogger(__name__)

# `kick` re-arms a shard whose pending job holds a lease that expired this long ago: its worker was
# killed, and waiting for the `queued` flag to expire (minutes) would stall the shard.  Longer than the
# reaper's own grace, so a live job that is merely slow is rarely duplicated (and a duplicate is harmless).
KICK_STALE_LEASE_SECONDS = 5.0
# `kick` also re-arms a shard whose `queued` flag was set this long ago and that no running job has held
# since (a running job keeps the flag within one work lease): the process that set it died before it
# enqueued the job, or the job waits behind a backlog, where a duplicate costs one job that finds little.
KICK_UNSTARTED_SECONDS = 10.0


class Kind(StrEnum):
    BLOCKS = "blocks"
    PODS = "pods"
    NODES = "nodes"


@dataclass(frozen=True, slots=True)
class _Placement:
    """Where an allocation's index entries live (derived from its handle and GC attributes)."""

    handle: str
    node: str
    shard: int | None
    pod: str | None

    @classmethod
    def of(cls, slot: Slot, shards: int) -> _Placement:
        node = slot.attrs.get(ATTR_NODE, "")
        ns, name = slot.attrs.get(ATTR_NAMESPACE, ""), slot.attrs.get(ATTR_POD, "")
        return cls(
            handle=sanitize_handle(slot.handle),
            node=node,
            shard=shard_of(node, shards) if node else None,
            pod=pod_key(ns, name) if node and ns and name else None,
        )


@dataclass(slots=True)
class MirrorStats:
    published: int = 0  # ids newly added to a dirty set (repeats of a still-dirty id not counted)
    enqueued: int = 0
    malformed: int = 0  # stored block records or index entries that could not be decoded


@dataclass
class _Batch:
    """One write pipeline, the shards it must arm, and which of its replies count newly dirty ids."""

    mirror: Mirror
    pipe: redis.client.Pipeline
    armed: set[int] = field(default_factory=set)
    counted: list[int] = field(default_factory=list)  # indexes of SADD / script replies

    def dirty(self, shard: int, ids: Sequence[str]) -> None:
        if ids:
            self.counted.append(len(self.pipe))
            self.pipe.sadd(self.mirror.keys.dirty(shard), *ids)
            self.armed.add(shard)

    def dirty_node(self, shard: int, node: str) -> None:
        keys = self.mirror.keys
        self.counted.append(len(self.pipe))
        self.mirror.scripts.dirty_from_set(
            keys=[keys.dirty(shard), keys.nodeallocs(shard, node)], args=[], client=self.pipe
        )
        self.armed.add(shard)

    def drop_timers(self, shard: int, ids: Sequence[str]) -> None:
        if ids:
            keys = self.mirror.keys
            self.pipe.hdel(keys.cand(shard), *ids)
            self.pipe.zrem(keys.due(shard), *ids)
            self.pipe.hdel(keys.decided(shard), *ids)

    def execute(self) -> int:
        """Run the pipeline, enqueue newly armed shards; returns the number of ids newly made dirty."""
        if not len(self.pipe):
            return 0
        shards = sorted(self.armed)
        ttl_ms = int(self.mirror.queued_ttl * 1000)
        for s in shards:
            self.pipe.set(self.mirror.keys.queued(s), b"1", nx=True, px=ttl_ms)
        if shards:  # wakes the lingering shard jobs, which poll this one key (shared/keys.py)
            self.pipe.incr(self.mirror.keys.pulse)
        results = self.pipe.execute()
        published = sum(int(results[i]) for i in self.counted)
        self.mirror.stats.published += published
        end = len(results) - (1 if shards else 0)  # the pulse INCR's reply comes last
        flags = results[end - len(shards) : end]
        self.mirror.enqueue_shards([s for s, armed in zip(shards, flags, strict=True) if armed])
        return published


class Mirror:
    """Mirror of blocks, pods, nodes and config in Redis, with dirty publishing (see module docstring)."""

    def __init__(
        self,
        redis_client: redis.Redis,
        keys: Keys,
        shards: int = DEFAULT_SHARDS,
        enqueue: Callable[[int], None] | None = None,
        *,
        clock: Clock | None = None,
        chunk: int = 500,
        queued_ttl: float = k.QUEUED_TTL_SECONDS,
        job_lease: float = 60.0,
    ) -> None:
        self.redis = redis_client
        self.keys = keys
        self.shards = shards
        self.enqueue = enqueue
        self.clock: Clock = clock or SystemClock()
        self.chunk = chunk  # objects per round trip in relists and batch calls
        self.queued_ttl = queued_ttl
        self.job_lease = job_lease  # the workers' lease (seconds): how far ahead a running job holds `queued`
        self.scripts = ProducerScripts.register(redis_client)
        self.stats = MirrorStats()
        # Told every block this mirror is given, changed or not (`producer.metrics.BlockTally`).
        self.block_observer: Callable[[str, BlockRecord | None], None] | None = None

    def _batch(self) -> _Batch:
        return _Batch(self, self.redis.pipeline(transaction=False))

    def enqueue_shards(self, shards: Sequence[int]) -> None:
        """Hand newly armed shards to the job queue.  If enqueueing fails, drop the `queued` flags not yet
        backed by a job, so the next event (or `kick`) retries instead of the shard stalling."""
        pending = list(shards)
        try:
            while pending:
                if self.enqueue is not None:
                    self.enqueue(pending[0])
                self.stats.enqueued += 1
                pending.pop(0)
        finally:
            if pending:
                self.redis.delete(*(self.keys.queued(s) for s in pending))

    # -- blocks ---------------------------------------------------------------------------------------

    def apply_block(self, block: IPAMBlock) -> int:
        return self.apply_blocks([block])

    def delete_block(self, cidr: str) -> int:
        return self._blocks({str(parse_network(cidr)): None})

    def apply_blocks(self, blocks: Iterable[IPAMBlock]) -> int:
        """Mirror block add/update events (a soft-deleted block is a delete).  Returns dirty ids published."""
        latest: dict[str, IPAMBlock | None] = {}
        for b in blocks:
            latest[b.cidr_str] = None if b.deleted else b
        return self._blocks(latest)

    def _blocks(self, latest: dict[str, IPAMBlock | None]) -> int:
        published = 0
        items = list(latest.items())
        for i in range(0, len(items), self.chunk):
            published += self._blocks_chunk(dict(items[i : i + self.chunk]))
        return published

    def _blocks_chunk(self, latest: dict[str, IPAMBlock | None]) -> int:
        cidrs = list(latest)
        if not cidrs:
            return 0
        raw = [_opt_bytes(v) for v in self.redis.hmget(self.keys.blocks, cidrs)]
        batch = self._batch()
        vanished_on: dict[str, int] = {}  # node → shard, for nodes that lost an allocation
        for cidr, old_bytes in zip(cidrs, raw, strict=True):
            old = self._decode_block(cidr, old_bytes)
            new = latest[cidr]
            rec = block_record(new) if new is not None else None
            if self.block_observer is not None:
                self.block_observer(cidr, rec)
            if old is None and rec is None:
                continue
            if old is not None and rec is not None and old == rec:
                continue
            self._diff_block(batch, cidr, old, rec, vanished_on)
            self._block_host(batch, cidr, old.host if old else None, rec.host if rec else None)
            if rec is None:
                batch.pipe.hdel(self.keys.blocks, cidr)
            else:
                batch.pipe.hset(self.keys.blocks, cidr, encode_block(rec))
        if vanished_on:
            # A node that is gone may now be drained: re-validate what is left on it (its tunnel IPs).
            nodes = list(vanished_on)
            present = self.redis.hmget(self.keys.nodes, nodes)
            for node, rec_bytes in zip(nodes, present, strict=True):
                if rec_bytes is None:
                    batch.dirty_node(vanished_on[node], node)
        return batch.execute()

    def _decode_block(self, cidr: str, data: bytes | None) -> BlockRecord | None:
        if data is None:
            return None
        try:
            rec = decode_block(data)
            size = block_size(parse_network(cidr))
            if any(not 0 <= o < size for o in rec.slots):  # forged or corrupt: no IP to diff against
                raise WrongRecordShape("block", f"an ordinal outside {cidr}")
            return rec
        except (RecordError, AddressError) as exc:
            self.stats.malformed += 1
            log.warning("stored block record unreadable, rebuilding it: %s", exc, extra={"block": cidr})
            return None

    def _diff_block(
        self,
        batch: _Batch,
        cidr: str,
        old: BlockRecord | None,
        new: BlockRecord | None,
        vanished_on: dict[str, int],
    ) -> None:
        # Only the ordinals whose slot changed are looked at (an IP is one ordinal of one block, so an
        # allocation id can only match itself at the same ordinal): a block event costs what changed in
        # it, not the block's size (formatting every IP of a /26 per event was the watcher's hot spot).
        net = parse_network(cidr)
        old_slots = old.slots if old is not None else {}
        new_slots = new.slots if new is not None else {}
        changed = sorted(
            o for o in old_slots.keys() | new_slots.keys() if old_slots.get(o) != new_slots.get(o)
        )
        before: dict[str, Slot] = {}
        after: dict[str, tuple[Allocation, Slot]] = {}
        for o in changed:
            ip = str(ordinal_to_ip(net, o))
            if (slot := old_slots.get(o)) is not None:
                before[allocation_id(slot.handle, ip)] = slot
            if (slot := new_slots.get(o)) is not None:
                a = Allocation(ip, o, cidr, slot.handle, slot.attrs, slot.sequence_number)
                after[a.id] = (a, slot)
        reset: dict[int, set[str]] = {}
        dirty: dict[int, set[str]] = {}
        for alloc_id in [*before, *(i for i in after if i not in before)]:
            old_slot = before.get(alloc_id)
            pair = after.get(alloc_id)
            if pair is not None and old_slot == pair[1]:
                continue  # unchanged
            was = _Placement.of(old_slot, self.shards) if old_slot is not None else None
            now = _Placement.of(pair[1], self.shards) if pair is not None else None
            if was is not None:
                if was != now:
                    self._unindex(batch, alloc_id, was)
                if was.shard is not None:  # vanished or changed: its leak state restarts (#12839)
                    reset.setdefault(was.shard, set()).add(alloc_id)
            if pair is None or now is None:
                if was is not None and was.shard is not None:
                    dirty.setdefault(was.shard, set()).add(alloc_id)
                    vanished_on[was.node] = was.shard
                continue
            record = encode_allocation(pair[0])
            if was != now:
                self._index(batch, alloc_id, now, record)
            elif now.shard is not None:
                batch.pipe.hset(self.keys.alloc(now.shard), alloc_id, record)
            if now.shard is not None:
                dirty.setdefault(now.shard, set()).add(alloc_id)
                if was is not None:
                    reset.setdefault(now.shard, set()).add(alloc_id)
        for shard, ids in sorted(reset.items()):
            batch.drop_timers(shard, sorted(ids))
        for shard, ids in sorted(dirty.items()):
            batch.dirty(shard, sorted(ids))

    def _index(self, batch: _Batch, alloc_id: str, p: _Placement, record: bytes) -> None:
        pipe = batch.pipe
        pipe.hset(self.keys.handle(p.handle), handle_field(alloc_id), p.node)
        if p.shard is None:
            return
        pipe.hset(self.keys.alloc(p.shard), alloc_id, record)
        pipe.sadd(self.keys.nodeallocs(p.shard, p.node), alloc_id)
        if p.pod is not None:
            args = [p.pod, alloc_id, str(p.shard)]
            self.scripts.map_put(keys=[self.keys.podallocs], args=args, client=pipe)

    def _unindex(self, batch: _Batch, alloc_id: str, p: _Placement) -> None:
        pipe = batch.pipe
        pipe.hdel(self.keys.handle(p.handle), handle_field(alloc_id))
        if p.shard is None:
            return
        pipe.hdel(self.keys.alloc(p.shard), alloc_id)
        pipe.srem(self.keys.nodeallocs(p.shard, p.node), alloc_id)
        if p.pod is not None:
            self.scripts.map_del(keys=[self.keys.podallocs], args=[p.pod, alloc_id], client=pipe)

    def _block_host(self, batch: _Batch, cidr: str, old: str | None, new: str | None) -> None:
        if old == new:
            return
        if old is not None:
            batch.pipe.srem(self.keys.nodeblocks(shard_of(old, self.shards), old), cidr)
        if new is not None:
            batch.pipe.sadd(self.keys.nodeblocks(shard_of(new, self.shards), new), cidr)

    # -- pods -----------------------------------------------------------------------------------------

    def apply_pod(self, pod: Pod) -> int:
        return self.apply_pods([pod])

    def delete_pod(self, namespace: str, name: str) -> int:
        return self.delete_pods([(namespace, name)])

    def apply_pods(self, pods: Iterable[Pod]) -> int:
        """Mirror pod add/update events; a pod whose slim record changed dirties the allocations naming it."""
        latest = {pod_key(p.namespace, p.name): p for p in pods}
        items = list(latest.items())
        published = 0
        for i in range(0, len(items), self.chunk):
            chunk = dict(items[i : i + self.chunk])
            names = list(chunk)
            read = self.redis.pipeline(transaction=False)
            read.hmget(self.keys.pods, names)
            read.hmget(self.keys.podallocs, names)
            old, owned = read.execute()
            batch = self._batch()
            for name, before, allocs in zip(names, old, owned, strict=True):
                record = encode_pod(chunk[name])
                if before == record:
                    continue
                batch.pipe.hset(self.keys.pods, name, record)
                self._dirty_owned(batch, name, allocs)
            published += batch.execute()
        return published

    def delete_pods(self, names: Iterable[tuple[str, str]]) -> int:
        """Mirror pod deletions; a pod that was mirrored dirties the allocations naming it."""
        keys = list(dict.fromkeys(pod_key(ns, n) for ns, n in names))
        published = 0
        for i in range(0, len(keys), self.chunk):
            chunk = keys[i : i + self.chunk]
            read = self.redis.pipeline(transaction=False)
            for name in chunk:
                read.hdel(self.keys.pods, name)
            read.hmget(self.keys.podallocs, chunk)
            *removed, owned = read.execute()
            batch = self._batch()
            for name, gone, allocs in zip(chunk, removed, owned, strict=True):
                if gone:
                    self._dirty_owned(batch, name, allocs)
            published += batch.execute()
        return published

    def _dirty_owned(self, batch: _Batch, name: str, raw: bytes | None) -> None:
        """Dirty the allocations the `podallocs` index lists for pod `name`."""
        if raw is None:
            return
        try:
            owned = as_str_map("podallocs", name, unpack("podallocs", raw))
            by_shard: dict[int, list[str]] = {}
            for alloc_id, shard_text in owned.items():
                shard = int(shard_text)
                if not 0 <= shard < self.shards:
                    raise ValueError(f"shard {shard_text} of {alloc_id} is not one of 0..{self.shards - 1}")
                by_shard.setdefault(shard, []).append(alloc_id)
        except (RecordError, ValueError) as exc:
            self.stats.malformed += 1
            log.warning("unreadable podallocs entry, pod event dirties nothing: %s", exc, extra={"pod": name})
            return
        for shard, ids in sorted(by_shard.items()):
            batch.dirty(shard, sorted(ids))

    # -- nodes ----------------------------------------------------------------------------------------

    def apply_node(self, node: Node) -> int:
        return self.apply_nodes([node])

    def delete_node(self, name: str) -> int:
        return self.delete_nodes([name])

    def apply_nodes(self, nodes: Iterable[Node]) -> int:
        """Mirror node add/update events; a new node (or a new uid for a name) dirties its allocations."""
        latest = {n.name: n for n in nodes}
        names = list(latest)
        published = 0
        for i in range(0, len(names), self.chunk):
            chunk = names[i : i + self.chunk]
            old = [_opt_bytes(v) for v in self.redis.hmget(self.keys.nodes, chunk)]
            batch = self._batch()
            for name, before in zip(chunk, old, strict=True):
                record = encode_node(latest[name])
                if before == record:
                    continue
                batch.pipe.hset(self.keys.nodes, name, record)
                if before is None or not _same_uid(before, record):
                    batch.dirty_node(shard_of(name, self.shards), name)
            published += batch.execute()
        return published

    def delete_nodes(self, names: Iterable[str]) -> int:
        """Mirror node deletions: every allocation of the node (tunnel IPs included) and its blocks."""
        unique = list(dict.fromkeys(names))
        published = 0
        for i in range(0, len(unique), self.chunk):
            chunk = unique[i : i + self.chunk]
            read = self.redis.pipeline(transaction=False)
            for name in chunk:
                read.hdel(self.keys.nodes, name)
            removed = read.execute()
            batch = self._batch()
            for name, gone in zip(chunk, removed, strict=True):
                if not gone:
                    continue
                shard = shard_of(name, self.shards)
                batch.dirty_node(shard, name)
                self.scripts.dirty_from_set(
                    keys=[self.keys.dirtyblocks(shard), self.keys.nodeblocks(shard, name)],
                    args=[],
                    client=batch.pipe,
                )
            published += batch.execute()
        return published

    # -- config, resync, relist, kick -------------------------------------------------------------------

    def ensure_layout(self) -> None:
        """Record the shard count; refuse to run against a Redis laid out for another one."""
        self.redis.hsetnx(self.keys.state, k.STATE_SHARDS, str(self.shards))
        stored = _opt_bytes(self.redis.hget(self.keys.state, k.STATE_SHARDS))
        if stored is not None and stored != str(self.shards).encode():
            raise ConfigError(
                f"Redis holds data for {stored.decode(errors='replace')} shards, this watcher runs "
                f"{self.shards}: flush the {self.keys.prefix} keys first"
            )

    def set_config(self, grace: float | None, datastore_ready: bool) -> bool:
        """Store the leak grace period (seconds, None = unset) and readiness; a change dirties everything."""
        self.ensure_layout()
        before = self.redis.hmget(self.keys.state, [k.STATE_GRACE, k.STATE_DATASTORE_READY])
        grace_text = None if grace is None else repr(float(grace))
        ready_text = "1" if datastore_ready else "0"
        pipe = self.redis.pipeline(transaction=False)
        if grace_text is None:
            pipe.hdel(self.keys.state, k.STATE_GRACE)
        else:
            pipe.hset(self.keys.state, k.STATE_GRACE, grace_text)
        pipe.hset(self.keys.state, k.STATE_DATASTORE_READY, ready_text)
        pipe.execute()
        configured_before = before[1] is not None
        changed = configured_before and (
            before[0] != (grace_text.encode() if grace_text else None) or before[1] != ready_text.encode()
        )
        if changed:
            log.info("configuration changed, re-validating every allocation", extra={"grace": grace_text})
            self.mark_all_dirty()
        return changed

    def mark_synced(self, synced: bool = True) -> None:
        """The initial list of every kind is mirrored: workers may now treat a missing pod as gone.
        Not yet: the `listing` marker is set instead, so a Redis that loses its data while we list is
        told by the marker's absence (the watcher checks it before it marks the mirror synced)."""
        pipe = self.redis.pipeline(transaction=False)
        if synced:
            pipe.hset(self.keys.state, k.STATE_SYNCED, "1")
            pipe.hdel(self.keys.state, k.STATE_LISTING)
        else:
            pipe.hdel(self.keys.state, k.STATE_SYNCED)
            pipe.hset(self.keys.state, k.STATE_LISTING, "1")
        pipe.execute()
        if synced:
            self.kick()

    def mark_all_dirty(self, chunk: int = 5000, pause: Callable[[], None] | None = None) -> int:
        """Full resync (the backstop): every allocation dirty, `chunk` ids per round trip per shard.
        `pause` runs between chunks (the watcher throttles with it; an exception it raises aborts)."""
        added = 0
        for shard in range(self.shards):
            cursor = b"0"
            while True:
                if pause is not None and (shard or cursor != b"0"):
                    pause()
                cursor, n = self.scripts.mark_dirty_chunk(
                    keys=[self.keys.alloc(shard), self.keys.dirty(shard)], args=[cursor, chunk]
                )
                added += int(n)
                if cursor == b"0":
                    break
        self.redis.hset(self.keys.state, k.STATE_LAST_FULL_RESYNC, repr(self.clock.now()))
        self.kick()
        return added

    def kick(self) -> list[int]:
        """Enqueue a job for every shard with work and none pending (dirty ids, due candidates, expired
        leases).  Run it periodically: it is what re-checks candidates when no event arrives."""
        now = repr(self.clock.now())
        ttl_ms = int(self.queued_ttl * 1000)
        hold_ms = int(self.job_lease * 1000)
        unstarted_ms = int(KICK_UNSTARTED_SECONDS * 1000)
        pipe = self.redis.pipeline(transaction=False)
        for s in range(self.shards):
            keys = [self.keys.queued(s), self.keys.dirty(s), self.keys.due(s), self.keys.inflight(s)]
            args: list[str | int | float] = [now, ttl_ms, KICK_STALE_LEASE_SECONDS, unstarted_ms, hold_ms]
            self.scripts.kick(keys=keys, args=args, client=pipe)
        armed = [s for s, flag in enumerate(pipe.execute()) if flag]
        self.enqueue_shards(armed)
        return armed

    def relist(self, kind: Kind | str, objects: Iterable[object], keep: Iterable[str] | None = ()) -> int:
        """Replace the whole mirrored set of `kind` with a fresh list, emitting the deletes a missed
        watch would have (anything mirrored but absent is deleted and dirtied).  `keep` names mirrored
        objects to leave as they are although absent (listed but unparsable: keep what they may hold);
        None keeps every mirrored one (an unidentifiable object was skipped): nothing is deleted."""
        kind = Kind(kind)
        fresh = list(objects)
        want = {Kind.BLOCKS: IPAMBlock, Kind.PODS: Pod, Kind.NODES: Node}[kind]
        for obj in fresh:
            if not isinstance(obj, want):
                raise TypeError(f"relist {kind}: {type(obj).__name__} is not {want.__name__}")
        hash_key = {Kind.BLOCKS: self.keys.blocks, Kind.PODS: self.keys.pods, Kind.NODES: self.keys.nodes}[
            kind
        ]
        mirrored = {_opt_bytes(f) or b"" for f in self.redis.hkeys(hash_key)}
        # Fields not written by us (not UTF-8, not `ns/name`) are left alone: never a crash on a relist.
        names = set() if keep is None else {f.decode(errors="replace") for f in mirrored} - set(keep)
        if kind is Kind.BLOCKS:
            blocks = [o for o in fresh if isinstance(o, IPAMBlock)]
            live = {b.cidr_str for b in blocks if not b.deleted}
            gone: dict[str, IPAMBlock | None] = dict.fromkeys(sorted(names - live))
            return self._blocks(gone) + self.apply_blocks(blocks)
        if kind is Kind.PODS:
            pods = [o for o in fresh if isinstance(o, Pod)]
            present = {pod_key(p.namespace, p.name) for p in pods}
            missing = [(ns, n) for ns, _, n in (name.partition("/") for name in sorted(names - present))]
            return self.delete_pods((ns, n) for ns, n in missing) + self.apply_pods(pods)
        nodes = [o for o in fresh if isinstance(o, Node)]
        self.delete_nodes(sorted(names - {n.name for n in nodes}))
        return self.apply_nodes(nodes)


def _opt_bytes(value: object) -> bytes | None:
    """Narrow a Redis reply: this code runs with `decode_responses=False`, so values are bytes."""
    if value is None or isinstance(value, bytes):
        return value
    raise TypeError(f"expected bytes from Redis, got {type(value).__name__} (use decode_responses=False)")


def _same_uid(before: bytes, after: bytes) -> bool:
    """Whether two node records name the same node incarnation (unreadable: assume not)."""
    try:
        return decode_node("", before).uid == decode_node("", after).uid
    except RecordError:
        return False
