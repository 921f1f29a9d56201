"""The watcher's Redis mirror: keep the state validation reads, and publish exactly what an event dirtied.

The Kubernetes list/watch loop (elsewhere) calls one method per batch of events.  The active watcher is the
only writer of the mirror, so it diffs each event against its own memory (`producer/memory.py`: the last
block records, pod → allocations, node → blocks, pod and node fingerprints) and never
reads its own records back from Redis on the hot path.  The writes of a batch are merged per key and sent
in one pipeline (`producer/writes.py`); a shard whose `queued` flag the batch newly set gets one
`enqueue(shard)` call (the producer does not import RQ; the entry point wires the callback), and the
`pulse` counter tells long-lived shard jobs to look again.  The loop must also call `kick()` every few
seconds (candidates whose grace period ended, expired leases) and `mark_all_dirty()` as the periodic full
resync (Calico: every leak grace period / 2, else 5 minutes).

What dirties what, at allocation granularity (spec §3.3, §3.4, §8.8):
- block: its new allocations, its changed ones (sequence number or GC attributes; the stored record is
  refreshed and the candidate timer reset, #12839) and its vanished ones (also removed from every index,
  timers dropped; if their node is gone, the node's remaining allocations too: its tunnel IPs may now go);
  a `host:`-affine block whose in-use count is 0 is indexed in `P:empty` for the leader;
- pod add/change/delete: the allocations whose attributes name the pod;
- node add: its allocations; node delete: its allocations and its blocks;
- VM or VMI appearing or going, VMI owner changing: the VM allocations naming it (`producer/kubevirt.py`);
- config change (grace period, datastore readiness): everything.
Allocations without a `node` attribute are kept in the handle index only and never dirtied.  Every write
is idempotent and every add path has its remove path, so replaying or merging events is harmless.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

import redis

from producer import layout
from producer.blockdiff import BlockDiff
from producer.kubevirt import KubeVirtMirror
from producer.memory import HeldBlock, Memory, same_node_uid
from producer.redis_scripts import ProducerScripts
from producer.slim import BadAttribute, lean_of
from producer.writes import Writes
from shared import keys as k
from shared import luapipe
from shared.clock import Clock, SystemClock
from shared.errors import ConfigError
from shared.keys import Keys, pod_key
from shared.model import (
    IPAMBlock,
    Node,
    Pod,
)
from shared.netaddr import parse_network
from shared.records import (
    LeanBlock,
    MirroredBlock,
    encode_block_packed,
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


@dataclass(slots=True)
class MirrorStats:
    published: int = 0  # ids newly added to a dirty set (repeats of a still-dirty id not counted)
    enqueued: int = 0
    malformed: int = 0  # stored block records that could not be decoded (at load)


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
        self.chunk = chunk  # objects per pipeline in relists and batch calls
        self.queued_ttl = queued_ttl
        self.job_lease = job_lease  # the workers' lease (seconds): how far ahead a running job holds `queued`
        self.scripts = ProducerScripts.register(redis_client)
        self.stats = MirrorStats()
        self.memory = Memory(shards)
        # Told every block this mirror is given, changed or not, as (cidr, host, allocations per node), or
        # (cidr, None, None) when it is gone (`producer.metrics.BlockTally.observe_counts`).
        self.block_observer: Callable[[str, str | None, Mapping[str, int] | None], None] | None = None
        # Calico's per-node baseline (`Settings.per_node`): the nodes an event touched since the last take.
        self.touched_nodes: set[str] = set()
        self.nodes_deleted = False
        # A block event refused when one of its changed attributes was decoded (the watcher counts it
        # with the malformed objects its reflectors refuse).
        self.on_malformed_block: Callable[[], None] = lambda: None
        self._open: Writes | None = None  # the writes of `batch()` in progress
        # The workers' gate as this mirror last wrote it (None: not written by this process).  While it
        # is closed (listing, or the datastore not ready) no shard is armed: a job would only find the
        # gate shut.  Opening it (`mark_synced`, `set_config`) kicks every shard with work.
        self._synced: bool | None = None
        self._ready: bool | None = None
        self.kubevirt = KubeVirtMirror(self)  # `P:vms`, `P:vmis`, `state.kubevirt`

    # -- memory and writes ---------------------------------------------------------------------------------

    def _memory(self) -> Memory:
        if not self.memory.loaded:
            before = self.memory.malformed
            self.memory.load(self.redis, self.keys)
            self.stats.malformed += self.memory.malformed - before
        return self.memory

    def _writes(self) -> Writes:
        return self._open if self._open is not None else Writes(self.keys, self.scripts)

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Every apply/delete call inside shares one `Writes`, sent at the end: a batch of watch events
        of several kinds is one pipeline, one command per key (dirty sets, `queued` flags and `pulse`
        once, not once per kind).  Relists are not wrapped: they send a pipeline per `chunk`."""
        if self._open is not None:
            yield
            return
        self._open = writes = Writes(self.keys, self.scripts)
        try:
            yield
        finally:
            self._open = None
        self._send(writes)

    def _send(self, writes: Writes) -> int:
        """Run a batch; on a Redis error the memory is rebuilt from Redis before the next call (the batch
        may be half-applied there), and the error propagates (the caller applies the batch again).
        Inside `batch()`, the shared writes are sent when it ends (0 here)."""
        if writes is self._open:
            return 0
        try:
            published, armed = writes.execute(self.redis, int(self.queued_ttl * 1000), arm=self.gate_open)
        except redis.RedisError:
            self.memory.clear()
            raise
        self.stats.published += published
        self.enqueue_shards(armed)
        return published

    @property
    def gate_open(self) -> bool:
        """Whether the workers' gate is open as far as this mirror wrote it (see `_synced`)."""
        return self._synced is not False and self._ready is not False

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

    def pod_allocations(self, namespace: str, name: str) -> dict[str, int]:
        """The allocation ids (→ shard) whose attributes name this pod (the watcher's own index)."""
        mem = self._memory()
        return dict(mem.owned(mem.pod_allocs, pod_key(namespace, name)))

    # -- blocks ---------------------------------------------------------------------------------------

    def apply_block(self, block: IPAMBlock | MirroredBlock) -> int:
        return self.apply_blocks([block])

    def delete_block(self, cidr: str) -> int:
        return self._blocks({str(parse_network(cidr)): None})

    def apply_blocks(self, blocks: Iterable[IPAMBlock | MirroredBlock]) -> int:
        """Mirror block add/update events (a soft-deleted block is a delete).  Returns dirty ids published."""
        latest: dict[str, IPAMBlock | MirroredBlock | None] = {}
        for b in blocks:
            latest[b.cidr_str] = None if b.deleted else b
        return self._blocks(latest)

    def _blocks(self, latest: Mapping[str, IPAMBlock | MirroredBlock | None]) -> int:
        published = 0
        items = list(latest.items())
        for i in range(0, len(items), self.chunk):
            published += self._blocks_chunk(items[i : i + self.chunk])
        return published

    def _blocks_chunk(self, items: list[tuple[str, IPAMBlock | MirroredBlock | None]]) -> int:
        mem = self._memory()
        writes = self._writes()
        vanished_on: dict[str, int] = {}  # node → shard, for nodes that lost an allocation
        diff = BlockDiff(self.keys, self.shards, mem, writes, vanished_on, self.touched_nodes)
        now = self.clock.now()
        for cidr, new in items:
            old = mem.blocks.get(cidr)
            rec = None if new is None else _lean_of(new)
            if old is None and rec is None:
                self._observe(cidr, None)
                continue
            if old is not None and rec is not None and old.lean == rec:
                self._observe(cidr, old)
                continue
            try:
                held = diff.block(cidr, old, rec, now)
            except BadAttribute as exc:
                # As the generic path treats a block it cannot read: not mirrored, so none of its IPs can
                # be released on the strength of it (its allocations vanish from the mirror).
                log.warning("malformed ipamblocks %s: %s; not mirrored, its IPs are kept", cidr, exc)
                self.on_malformed_block()
                held = diff.block(cidr, old, None, now) if old is not None else None
            self._observe(cidr, held)
            if held is None:
                if old is not None:
                    del mem.blocks[cidr]
                    writes.base_del(self.keys.blocks, cidr)
            else:
                mem.blocks[cidr] = held
                lean = held.lean
                record = encode_block_packed(
                    lean.resource_version, lean.uid, lean.host, lean.in_use, held.packed, lean.cooling_since
                )
                writes.base_set(self.keys.blocks, cidr, record)
        for node, shard in vanished_on.items():
            # A node that is gone may now be drained: re-validate what is left on it (its tunnel IPs).
            if node not in mem.nodes:
                writes.dirty_node_sets.append((shard, node))
        return self._send(writes)

    def _observe(self, cidr: str, held: HeldBlock | None) -> None:
        if self.block_observer is not None:
            if held is None:
                self.block_observer(cidr, None, None)
            else:
                self.block_observer(cidr, held.host, held.nodes)

    # -- pods -----------------------------------------------------------------------------------------

    def apply_pod(self, pod: Pod) -> int:
        return self.apply_pods([pod])

    def delete_pod(self, namespace: str, name: str) -> int:
        return self.delete_pods([(namespace, name)])

    def apply_pods(self, pods: Iterable[Pod]) -> int:
        """Mirror pod add/update events; a pod whose slim record changed dirties the allocations naming it."""
        mem = self._memory()
        latest = {pod_key(p.namespace, p.name): p for p in pods}
        items = list(latest.items())
        published = 0
        for i in range(0, len(items), self.chunk):
            writes = self._writes()
            for name, pod in items[i : i + self.chunk]:
                record = encode_pod(pod)
                print_ = hash(record)
                before = mem.pods.get(name)
                if before is not None and before[0] == print_:
                    continue
                mem.pods[sys.intern(name)] = (print_, sys.intern(pod.node_name))  # shared with `pod_allocs`
                writes.base_set(self.keys.pods, name, record)
                self._dirty_owned(writes, name)
            published += self._send(writes)
        return published

    def delete_pods(self, names: Iterable[tuple[str, str]]) -> int:
        """Mirror pod deletions; a pod that was mirrored dirties the allocations naming it."""
        mem = self._memory()
        keys = list(dict.fromkeys(pod_key(ns, n) for ns, n in names))
        published = 0
        for i in range(0, len(keys), self.chunk):
            writes = self._writes()
            for name in keys[i : i + self.chunk]:
                gone = mem.pods.pop(name, None)
                if gone is None:
                    continue
                if gone[1]:
                    self.touched_nodes.add(gone[1])  # Calico's pod-delete handler: spec.nodeName dirty
                writes.base_del(self.keys.pods, name)
                self._dirty_owned(writes, name)
            published += self._send(writes)
        return published

    def _dirty_owned(self, writes: Writes, name: str) -> None:
        """Dirty the allocations the watcher's index lists for pod `name`."""
        for alloc_id, shard in self.memory.owned(self.memory.pod_allocs, name):
            writes.mark_dirty(shard, (alloc_id,))

    # -- nodes ----------------------------------------------------------------------------------------

    def apply_node(self, node: Node) -> int:
        return self.apply_nodes([node])

    def delete_node(self, name: str) -> int:
        return self.delete_nodes([name])

    def apply_nodes(self, nodes: Iterable[Node]) -> int:
        """Mirror node add/update events; a new node (or a new uid for a name) dirties its allocations."""
        mem = self._memory()
        latest = {n.name: n for n in nodes}
        names = list(latest)
        published = 0
        for i in range(0, len(names), self.chunk):
            writes = self._writes()
            for name in names[i : i + self.chunk]:
                record = encode_node(latest[name])
                before = mem.nodes.get(name)
                if before == record:
                    continue
                mem.nodes[name] = record
                writes.base_set(self.keys.nodes, name, record)
                if before is None or not same_node_uid(before, record):
                    writes.dirty_node_sets.append((shard_of(name, self.shards), name))
            published += self._send(writes)
        return published

    def delete_nodes(self, names: Iterable[str]) -> int:
        """Mirror node deletions: every allocation of the node (tunnel IPs included) and its blocks."""
        mem = self._memory()
        unique = list(dict.fromkeys(names))
        published = 0
        for i in range(0, len(unique), self.chunk):
            writes = self._writes()
            for name in unique[i : i + self.chunk]:
                if mem.nodes.pop(name, None) is None:
                    continue
                self.nodes_deleted = True
                shard = shard_of(name, self.shards)
                writes.base_del(self.keys.nodes, name)
                writes.dirty_node_sets.append((shard, name))
                cidrs = mem.node_blocks.get(name)
                if cidrs:
                    writes.dirty_blocks.setdefault(shard, set()).update(cidrs)
            published += self._send(writes)
        return published

    # -- Calico's per-node baseline (the benchmark's `per-node` mode) ----------------------------------

    def dirty_nodes(self, nodes: Iterable[str]) -> int:
        """Every allocation of each of `nodes` dirty (Calico 3.30's unit of re-validation), from the
        `nodeallocs` sets in Redis as node events do."""
        writes = self._writes()
        for node in nodes:
            writes.dirty_node_sets.append((shard_of(node, self.shards), node))
        return self._send(writes)

    def walk_blocks(self) -> tuple[int, int, int]:
        """What Calico's `updateMetrics` and `releaseUnusedBlocks` do on every pass: every block and every
        allocation counted by node, every empty block looked at.  Returns (blocks, allocations, empty)."""
        per_node: dict[str, int] = {}
        allocations = empty = 0
        for held in self._memory().blocks.values():
            if held.host is not None and held.in_use == 0:
                empty += 1
            for _ in held.packed:  # Calico reads every allocation's attributes; counts are kept per node
                allocations += 1
            for node, n in held.nodes.items():
                per_node[node] = per_node.get(node, 0) + n
        return len(self.memory.blocks), allocations, empty

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

    def migrate_layout(self) -> int:
        """Bring a Redis written by an older ipamgc to this layout (`producer/layout.py`)."""
        return layout.migrate(self.redis, self.keys, self._memory, self.scripts)

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
        opened = self._ready is False and datastore_ready
        self._ready = datastore_ready
        configured_before = before[1] is not None
        changed = configured_before and (
            before[0] != (grace_text.encode() if grace_text else None) or before[1] != ready_text.encode()
        )
        if changed:
            log.info("configuration changed, re-validating every allocation", extra={"grace": grace_text})
            self.mark_all_dirty()  # kicks
        elif opened:
            self.kick()
        return changed

    def set_ip_cooldown(self, seconds: int | None) -> None:
        """Store IPAMConfig `default`'s cooldown (seconds) for the leader; None: forget it (this watcher
        has not listed IPAMConfigs yet, and the leader reads the live object instead)."""
        if seconds is None:
            self.redis.hdel(self.keys.state, k.STATE_IP_COOLDOWN)
        else:
            self.redis.hset(self.keys.state, k.STATE_IP_COOLDOWN, str(int(seconds)))

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
        self._synced = synced
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

    def kick(self, require: str | None = None) -> list[int] | None:
        """Enqueue a job for every shard with work and none pending (dirty ids, due candidates, expired
        leases).  Run it periodically: it is what re-checks candidates when no event arrives.  Nothing
        while the gate this mirror wrote is closed: opening it kicks.
        `require`: a `state` field read in the same round trip; when it is absent (Redis lost the
        mirror), nothing is enqueued and None is returned."""
        if not self.gate_open:
            return []
        now = repr(self.clock.now())
        ttl_ms = int(self.queued_ttl * 1000)
        hold_ms = int(self.job_lease * 1000)
        unstarted_ms = int(KICK_UNSTARTED_SECONDS * 1000)
        pipe = self.redis.pipeline(transaction=False)
        if require is not None:
            pipe.hget(self.keys.state, require)
        for s in range(self.shards):
            keys = [self.keys.queued(s), self.keys.dirty(s), self.keys.due(s), self.keys.inflight(s)]
            args: list[str | int | float] = [now, ttl_ms, KICK_STALE_LEASE_SECONDS, unstarted_ms, hold_ms]
            luapipe.add(pipe, self.scripts.kick, keys, args)
        replies = luapipe.execute(pipe, self.redis, [self.scripts.kick])
        if require is not None:
            present, *replies = replies
            if present is None:
                return None
        armed = [s for s, flag in enumerate(replies) if flag]
        self.enqueue_shards(armed)
        return armed

    def relist(self, kind: Kind | str, objects: Iterable[object], keep: Iterable[str] | None = ()) -> int:
        """Replace the whole mirrored set of `kind` with a fresh list, emitting the deletes a missed
        watch would have (anything mirrored but absent is deleted and dirtied).  `keep` names mirrored
        objects to leave as they are although absent (listed but unparsable: keep what they may hold);
        None keeps every mirrored one (an unidentifiable object was skipped): nothing is deleted."""
        session = self.begin_relist(kind)
        published = session.page(objects)
        return published + session.finish(keep)

    def begin_relist(self, kind: Kind | str) -> Relist:
        """A relist fed page by page as the pages arrive (`Relist.page`), then `finish`ed: a cold start
        holds one page of typed objects at a time, never the whole cluster."""
        return Relist(self, Kind(kind))


class Relist:
    """One relist of one kind in progress (see `Mirror.begin_relist`)."""

    def __init__(self, mirror: Mirror, kind: Kind) -> None:
        self.mirror = mirror
        self.kind = kind
        self.seen: set[str] = set()

    def page(self, objects: Iterable[object]) -> int:
        """Mirror one page of the list (upserts; what a page lists as deleted is deleted)."""
        m, kind = self.mirror, self.kind
        fresh = list(objects)
        want = {Kind.BLOCKS: (IPAMBlock, MirroredBlock), Kind.PODS: (Pod,), Kind.NODES: (Node,)}[kind]
        for obj in fresh:
            if not isinstance(obj, want):
                raise TypeError(f"relist {kind}: {type(obj).__name__} is not {want[0].__name__}")
        if kind is Kind.BLOCKS:
            blocks = [o for o in fresh if isinstance(o, (IPAMBlock, MirroredBlock))]
            self.seen.update(b.cidr_str for b in blocks if not b.deleted)
            return m.apply_blocks(blocks)
        if kind is Kind.PODS:
            pods = [o for o in fresh if isinstance(o, Pod)]
            self.seen.update(pod_key(p.namespace, p.name) for p in pods)
            return m.apply_pods(pods)
        nodes = [o for o in fresh if isinstance(o, Node)]
        self.seen.update(n.name for n in nodes)
        return m.apply_nodes(nodes)

    def finish(self, keep: Iterable[str] | None = ()) -> int:
        """Delete (and dirty) what is mirrored but was not listed, except `keep`; None: delete nothing."""
        if keep is None:
            return 0
        m, kind = self.mirror, self.kind
        mem = m._memory()
        mirrored: set[str] = set(
            mem.blocks if kind is Kind.BLOCKS else mem.pods if kind is Kind.PODS else mem.nodes
        )
        gone = sorted(mirrored - self.seen - set(keep))
        if kind is Kind.BLOCKS:
            return m._blocks(dict.fromkeys(gone))
        if kind is Kind.PODS:
            return m.delete_pods((ns, n) for ns, _, n in (name.partition("/") for name in gone))
        return m.delete_nodes(gone)


def _lean_of(block: IPAMBlock | MirroredBlock) -> LeanBlock:
    return block.record if isinstance(block, MirroredBlock) else lean_of(block)


def _opt_bytes(value: object) -> bytes | None:
    """Narrow a Redis reply: this code runs with `decode_responses=False`, so values are bytes."""
    if value is None or isinstance(value, bytes):
        return value
    raise TypeError(f"expected bytes from Redis, got {type(value).__name__} (use decode_responses=False)")
