"""The diff of one block event against the watcher's memory: which allocations appeared, changed or
vanished, and the index, record, timer, dirty and empty-block writes each implies (spec §3.3).

Why a module of its own: this is the watcher's hot path and its correctness core (every add path has its
remove path, #12277/#12279), kept apart from the other kinds (`producer/mirror.py`) and the batch writes
(`producer/sending.py`).
Only the ordinals whose attribute bytes changed are decoded and looked at, so an event costs what changed
in the block, not its size.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from itertools import compress, count
from operator import ne

from producer.memory import HeldBlock, Memory, Placement
from producer.slim import slot_of_attr
from producer.writes import Writes
from shared.blockrecords import LeanBlock, Seqs, Slot, decode_slot, encode_slot, in_ordinal_order
from shared.gcrecords import EmptyBlock, encode_empty, encode_handle_member
from shared.keys import Keys, handle_field
from shared.model import ATTR_NODE, Allocation, allocation_id
from shared.netaddr import block_ip_text
from shared.records import encode_allocation
from shared.shard import shard_of


class BlockDiff:
    """The blocks of one batch, diffed into `writes` (and the watcher's `memory`)."""

    def __init__(
        self,
        keys: Keys,
        shards: int,
        memory: Memory,
        writes: Writes,
        vanished_on: dict[str, int],
        touched_nodes: set[str],
    ) -> None:
        self.keys = keys
        self.shards = shards
        self.memory = memory
        self.writes = writes
        self.vanished_on = vanished_on  # node → shard, for nodes that lost an allocation
        self.touched_nodes = touched_nodes  # for Calico's per-node baseline (`Settings.per_node`)

    def block(self, cidr: str, old: HeldBlock | None, new: LeanBlock | None, now: float) -> HeldBlock | None:
        """One block that changed (`old` → `new`; None: absent).  Returns what the watcher now holds of it.
        Raises `BadAttribute` before writing anything if an attribute that changed is malformed."""
        changes = self._decoded(old, new)  # every changed ordinal decoded first: nothing half-applied
        held = None
        if new is not None:
            packed = dict(old.packed) if old is not None else {}
            nodes = dict(old.nodes) if old is not None else {}
            added = False
            for o, before, after in changes:
                if before is not None:
                    _count(nodes, before.attrs.get(ATTR_NODE, ""), -1)
                    del packed[o]
                if after is not None:
                    _count(nodes, after.attrs.get(ATTR_NODE, ""), 1)
                    packed[o] = encode_slot(after)
                    added = True
            # Kept in ordinal order (a slot added goes to the dict's end): the record is then packed as it
            # is (`encode_block_packed`), and an event that only frees ordinals keeps the order for free.
            held = HeldBlock(new.held(), in_ordinal_order(packed) if added else packed, nodes)
        self._ordinals(cidr, changes)
        self._host(cidr, old.host if old else None, new.host if new else None)
        self._empty(cidr, old, new, now)
        self._cold(cidr, old, new)
        return held

    @staticmethod
    def _decoded(old: HeldBlock | None, new: LeanBlock | None) -> list[tuple[int, Slot | None, Slot | None]]:
        # Only the ordinals whose attribute bytes or sequence number changed are decoded (an IP is one
        # ordinal of one block, so an allocation id can only match itself at the same ordinal): a block
        # event costs what changed in it, not the block's size.  The per-ordinal prints of the bytes of
        # the two events are compared in C (`map(ne)` picked out by `compress`), the sequence numbers as
        # dict items.  An ordinal the watcher holds no print of (loaded from Redis) counts as changed;
        # one whose decoded slot is the same is not a change.
        old_packed = old.packed if old is not None else {}
        changed: set[int]
        was_prints = old.lean.prints if old is not None else None
        if new is None:
            changed = set(old_packed)
        elif was_prints is None or old is None or new.prints is None or len(was_prints) != len(new.prints):
            changed = set(old_packed).union(new.allocated())
        else:
            changed = set(compress(count(), map(ne, was_prints, new.prints)))
            was_seqs, seqs = old.lean.seqs, new.seqs
            if was_seqs != seqs:  # a sequence number changed (on a changed ordinal, as a rule)
                if isinstance(was_seqs, array) and isinstance(seqs, array) and len(was_seqs) == len(seqs):
                    changed.update(compress(count(), map(ne, was_seqs, seqs)))  # in C, as the prints
                else:  # a map (a number beyond 64 bits): every ordinal of either
                    changed.update(_ordinals(was_seqs), _ordinals(seqs))
        out: list[tuple[int, Slot | None, Slot | None]] = []
        for o in sorted(changed):
            was = old_packed.get(o)
            before = decode_slot(was) if was is not None else None
            raw = new.raw(o) if new is not None else None
            after = slot_of_attr(raw) if raw is not None else None
            if before != after:
                out.append((o, before, after))
        return out

    def _ordinals(self, cidr: str, changes: list[tuple[int, Slot | None, Slot | None]]) -> None:
        if not changes:
            return
        for o, was, after in changes:
            ip = block_ip_text(cidr, o)
            now_id = allocation_id(after.handle, ip) if after is not None else None
            before = was
            if was is not None:
                was_id = allocation_id(was.handle, ip)
                if was_id != now_id:  # vanished (or replaced by another handle's allocation)
                    self._change(cidr, o, ip, was_id, was, None)
                    before = None
            if after is not None and now_id is not None:
                self._change(cidr, o, ip, now_id, before, after)

    def _change(
        self, cidr: str, o: int, ip: str, alloc_id: str, before: Slot | None, after: Slot | None
    ) -> None:
        """One allocation id (held at `cidr`'s ordinal `o`, IP `ip`) that appeared, changed or vanished."""
        was = Placement.of(before, self.shards) if before is not None else None
        now = Placement.of(after, self.shards) if after is not None else None
        if was is not None:
            if was != now:
                self._unindex(cidr, o, alloc_id, was)
            if was.shard is not None:  # vanished or changed: its leak state restarts (#12839)
                self.writes.drop_timers(was.shard, alloc_id)
        if after is None or now is None:
            if was is not None and was.shard is not None:
                self.writes.mark_dirty(was.shard, (alloc_id,))
                self.vanished_on[was.node] = was.shard
                self.touched_nodes.add(was.node)
            return
        self._publish(cidr, o, ip, alloc_id, after, now, was != now)
        if now.shard is not None:
            if was is not None:
                self.writes.drop_timers(now.shard, alloc_id)
            else:
                self.touched_nodes.add(now.node)

    def _publish(
        self, cidr: str, o: int, ip: str, alloc_id: str, slot: Slot, p: Placement, reindex: bool
    ) -> None:
        """Write a new or changed allocation's record (and its index entries if its placement is new)."""
        if reindex:
            self.writes.zadd(
                self.keys.handles, encode_handle_member(p.handle, handle_field(alloc_id), p.node)
            )
            self.memory.index(cidr, o, p)
            if p.shard is not None:
                self.writes.sadd(self.keys.nodeallocs(p.shard, p.node), alloc_id)
        if p.shard is not None:
            a = Allocation(ip, o, cidr, slot.handle, slot.attrs, slot.sequence_number)
            self.writes.hset(self.keys.alloc(p.shard), alloc_id, encode_allocation(a))
            self.writes.mark_dirty(p.shard, (alloc_id,))

    def _unindex(self, cidr: str, o: int, alloc_id: str, p: Placement) -> None:
        self.writes.zrem(self.keys.handles, encode_handle_member(p.handle, handle_field(alloc_id), p.node))
        self.memory.unindex(cidr, o, p)
        if p.shard is None:
            return
        self.writes.hdel(self.keys.alloc(p.shard), alloc_id)
        self.writes.srem(self.keys.nodeallocs(p.shard, p.node), alloc_id)

    def _host(self, cidr: str, old: str | None, new: str | None) -> None:
        if old == new:
            return
        self.memory.set_host(cidr, old, new)
        if old is not None:
            self.writes.srem(self.keys.nodeblocks(shard_of(old, self.shards), old), cidr)
        if new is not None:
            self.writes.sadd(self.keys.nodeblocks(shard_of(new, self.shards), new), cidr)

    def _empty(self, cidr: str, old: HeldBlock | None, new: LeanBlock | None, now: float) -> None:
        """`P:empty`: host-affine blocks with nothing in use, and since when (Calico's `emptyBlocks`)."""
        was = old is not None and old.host is not None and old.in_use == 0
        is_ = new is not None and new.host is not None and new.in_use == 0
        if is_ and new is not None and new.host is not None:
            if not was or (old is not None and old.host != new.host):
                self.writes.base_set(self.keys.empty, cidr, encode_empty(EmptyBlock(new.host, now)))
        elif was:
            self.writes.base_del(self.keys.empty, cidr)

    def _cold(self, cidr: str, old: HeldBlock | None, new: LeanBlock | None) -> None:
        """`P:coldblocks`: blocks with IPs in cooldown, and the earliest `releasedAt` (Calico's
        `coldBlocks`, read by the leader's cold-IP backstop)."""
        was = old.lean.cooling_since if old is not None else None
        is_ = new.cooling_since if new is not None else None
        if was == is_:
            return
        if is_ is None:
            self.writes.base_del(self.keys.coldblocks, cidr)
        else:
            self.writes.base_set(self.keys.coldblocks, cidr, repr(is_))


def _count(nodes: dict[str, int], node: str, n: int) -> None:
    left = nodes.get(node, 0) + n
    if left:
        nodes[node] = left
    else:
        del nodes[node]


def _ordinals(seqs: Seqs) -> range | Iterable[int]:
    """Every ordinal `seqs` can name: the array's length, or the map's keys."""
    return range(len(seqs)) if isinstance(seqs, array) else seqs.keys()
