"""The watcher's Redis mirror: keep the state validation reads, and publish exactly what an event dirtied.

The Kubernetes list/watch loop (elsewhere) calls one method per batch of events.  The active watcher is the
only writer of the mirror, so it diffs each event against its own memory (`producer/memory.py`: the last
block records, pod → allocations, node → blocks, pod and node fingerprints) and never
reads its own records back from Redis on the hot path.  The writes of a batch are merged per key and sent
in one pipeline (`producer/writes.py`, sent by `producer/sending.py`); a shard whose `queued` flag the
batch newly set gets one `enqueue(shard)` call (`producer/arming.py`; the producer does not import RQ
here, the entry point wires the callback), and the `pulse` counter tells long-lived shard jobs to look
again.  The loop must also call `kick()` every few seconds (candidates whose grace period ended, expired
leases) and `mark_all_dirty()` as the periodic full resync (Calico: every leak grace period / 2, else 5
minutes).  The `P:state` hash (layout, configuration, the workers' gate) is written by
`producer/statehash.py`.

This module keeps the per-kind apply paths (what an event dirties, decided against the watcher's memory;
the blocks' in `producer/blockmirror.py`) and the relists; the `Mirror` composes the rest and keeps the one
interface the watcher and tests use.

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
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence

import redis

from producer import layout
from producer.arming import MirrorStats, ShardArming
from producer.blockmirror import BlockMirror
from producer.heldips import held_ips
from producer.kubevirt import KubeVirtMirror
from producer.memory import Memory, same_node_uid
from producer.redis_scripts import ProducerScripts
from producer.relist import Kind, Relist
from producer.sending import BatchSender
from producer.statehash import StateHash
from producer.writes import Writes
from redisio.heldconn import HeldConnection
from shared import keys as k
from shared.blockrecords import MirroredBlock
from shared.clock import Clock, ServerClock, SystemClock
from shared.keys import Keys, pod_key
from shared.model import (
    IPAMBlock,
    Node,
    Pod,
)
from shared.netaddr import parse_network
from shared.records import encode_node, encode_pod
from shared.shard import DEFAULT_SHARDS, shard_of


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
        self.clock: Clock = clock or SystemClock()
        self.chunk = chunk  # objects per pipeline in relists and batch calls
        self.scripts = ProducerScripts.register(redis_client)
        self.stats = MirrorStats()
        self.memory = Memory(shards)
        # One connection kept for the batches' and kicks' pipelines (`redisio.heldconn`), held by the
        # thread that publishes (another thread's writes take the pool, as before).
        self.held = HeldConnection(redis_client)
        # What it composes: the jobs and the workers' gate, the sending of writes, the `P:state` hash.
        self.arming = ShardArming(
            redis_client,
            keys,
            shards,
            self.scripts,
            self.stats,
            enqueue,
            clock=self.clock,
            queued_ttl=queued_ttl,
            job_lease=job_lease,
            held=self.held,
        )
        self.sender = BatchSender(
            redis_client,
            keys,
            self.scripts,
            self.memory,
            self.stats,
            self.arming,
            queued_ttl,
            self.held,
            self.arming.generation,
        )
        self.generation = self.arming.generation  # `on_lost` is the watcher's (`producer/generation.py`)
        # A grace period change is stamped on the workers' clock (Redis `TIME`) unless one is injected.
        stamp: Clock = clock if clock is not None else ServerClock(redis_client)
        self.statehash = StateHash(redis_client, keys, shards, self.arming, stamp)
        # Bound once, not wrapped: every apply path (and `producer/kubevirt.py`) calls them per chunk, the
        # publisher `batch()` per batch.  `with mirror.batch():` every apply/delete call inside shares one
        # `Writes`, sent at the end (`BatchSender.batch`).
        self._writes: Callable[[], Writes] = self.sender.writes
        self._send: Callable[[Writes], int] = self.sender.send
        self.batch: Callable[[], contextlib.AbstractContextManager[None]] = self.sender.batch
        # Told every block this mirror is given, changed or not, as (cidr, host, allocations per node), or
        # (cidr, None, None) when it is gone (`producer.metrics.BlockTally.observe_counts`).
        self.block_observer: Callable[[str, str | None, Mapping[str, int] | None], None] | None = None
        # Calico's per-node baseline (`Settings.per_node`): the nodes an event touched since the last take.
        self.touched_nodes: set[str] = set()
        self.nodes_deleted = False
        # A block event refused when one of its changed attributes was decoded (the watcher counts it
        # with the malformed objects its reflectors refuse).
        self.on_malformed_block: Callable[[], None] = lambda: None
        self.kubevirt = KubeVirtMirror(self)  # `P:vms`, `P:vmis`, `state.kubevirt`
        self.block_mirror = BlockMirror(self)  # `P:blocks`
        # Its apply path bound once, as `_writes` is (`apply_blocks`, `delete_block`, `Relist.finish`).
        self._blocks = self.block_mirror.apply

    # -- memory and writes ---------------------------------------------------------------------------------

    def _memory(self) -> Memory:
        if not self.memory.loaded:
            before = self.memory.malformed
            self.memory.load(self.redis, self.keys)
            self.stats.malformed += self.memory.malformed - before
        return self.memory

    def held_memory(self) -> Memory:
        """What this watcher remembers of the mirror, loaded from Redis if it is not (the backstop)."""
        return self._memory()

    @property
    def gate_open(self) -> bool:
        """Whether the workers' gate is open as far as this mirror wrote it (`ShardArming.gate_open`)."""
        return self.arming.gate_open

    def enqueue_shards(self, shards: Sequence[int]) -> None:
        """Hand newly armed shards to the job queue (`ShardArming.enqueue_shards`)."""
        self.arming.enqueue_shards(shards)

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
                # The key interned: one string with `pod_allocs`.
                mem.pods[sys.intern(name)] = (print_, sys.intern(pod.node_name), held_ips(pod))
                writes.base_set(self.keys.pods, name, record)
                if before is None and self._first_listing():
                    continue  # what the index lists for it is dirty already, and untaken (`_first_listing`)
                self._dirty_owned(writes, name)
            published += self._send(writes)
        return published

    def _first_listing(self) -> bool:
        """Every allocation held was published dirty by this process and none taken since: its memory
        started empty (`Memory.fresh`) and the workers' gate is still shut as it wrote it at its start (a
        job finds it shut and hands its batch back).  A new pod then needs no dirtying: that lookup was
        15 % of the watcher's cold start at 150k pods (docs/benchmarks-history.md)."""
        return self.memory.fresh and self.arming.synced is False

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
        self.statehash.ensure_layout()

    def migrate_layout(self) -> int:
        """Bring a Redis written by an older ipamgc to this layout (`producer/layout.py`)."""
        return layout.migrate(self.redis, self.keys, self._memory, self.scripts)

    def set_config(self, grace: float | None, datastore_ready: bool) -> bool:
        """Store the leak grace period and readiness; a change dirties everything (`StateHash.set_config`)."""
        return self.statehash.set_config(grace, datastore_ready)

    def set_ip_cooldown(self, seconds: int | None) -> None:
        """Store IPAMConfig `default`'s cooldown for the leader, None forgets it (`StateHash`)."""
        self.statehash.set_ip_cooldown(seconds)

    def revalidate_when_synced(self) -> bool:
        """Whether Redis is not marked synced (a cold start, a flush, a predecessor that died listing): it
        may then hold records whose dirty ids were never written, so opening the gate starts a pass over
        every allocation (`P:revalidate:{s}`, `shared/keys.py`), and until then a first list into an empty
        memory writes none (every id dirty at once was Redis's peak: at 150k pods 166 MiB used, 148 since)."""
        self.arming.revalidate = not self.redis.hexists(self.keys.state, k.STATE_SYNCED)
        return self.arming.revalidate

    def mark_synced(self, synced: bool = True) -> None:
        """Open the workers' gate (or, False, set the `listing` marker): `StateHash.mark_synced`."""
        self.statehash.mark_synced(synced)

    def mark_all_dirty(self, chunk: int = 5000, pause: Callable[[], None] | None = None) -> int:
        """Full resync: every allocation dirty, then a kick (`ShardArming.mark_all_dirty`)."""
        return self.arming.mark_all_dirty(chunk, pause)

    def kick(self, require: str | None = None) -> list[int] | None:
        """Enqueue a job for every shard with work and none pending (`ShardArming.kick`); None when the
        `require`d `state` field is absent (Redis lost the mirror)."""
        return self.arming.kick(require)

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
