"""What the active watcher remembers of the mirror, so that an event costs what it changed.

The watcher is the only writer of the mirror.  It used to read back and decode its own records from Redis
to diff every block event against (a round trip and ~100 µs of msgpack per block event, the largest part
of its cost) and kept the pod → allocations index in Redis behind a Lua script per allocation.  Both now
live here, in the watcher's own memory:

- `blocks`: CIDR → the last block mirrored (`HeldBlock`: the event's lean record, each slot's packed
  stored form, its allocations per node), the base every block event is diffed against;
- `pod_allocs`: `<ns>/<name>` → the allocations (and their shards) whose attributes name the pod, each
  by where its slot is held (block CIDR, ordinal): its id (`<handle>/<ip>`, ~140 bytes a string, 20 MiB
  at 150k pods) is derived from the held slot when an event dirties it (`owned`);
- `vm_allocs`: `<ns>/<vmi-name>` → the same for the VM allocations naming a KubeVirt VM (its VM and VMI
  events dirty exactly these); `vms`, `vmis`: the mirrored VM and VMI records, by `<ns>/<name>`;
- `node_blocks`: node → the CIDRs of its `host:`-affine blocks (a node's allocations are not kept: node
  events dirty them from Redis's `nodeallocs` sets, which the workers judge a gone node on);
- `pods`, `nodes`: a fingerprint of each mirrored record (a pod event that changes nothing the rules read
  dirties nothing), a pod's node (Calico's per-node baseline dirties it on a pod delete) and the numbers
  of the IPs it reports (`producer/heldips.py`: the backstop's sweep reads them).

It is rebuilt from Redis when a watcher starts (`load`: one scan of the block, pod and node hashes) and
whenever a write to Redis failed half-way (the Redis side may then hold part of a batch: reloading and
diffing again writes the rest, every write being idempotent).  Redis keeps what the workers and the leader
read; nothing here is read by anyone else.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import cast

import redis

from producer.heldips import HeldIPs, held_ips
from shared.blockrecords import (
    BLOCK_SCAN_COUNT,
    BlockRecord,
    LeanBlock,
    Slot,
    decode_block_packed,
    decode_slot,
)
from shared.codec import RecordError, WrongRecordShape
from shared.keys import Keys, pod_key
from shared.model import ATTR_NAMESPACE, ATTR_NODE, ATTR_POD, ATTR_VMI_NAME, allocation_id, sanitize_handle
from shared.netaddr import AddressError, block_ip_text, block_size, parse_network
from shared.records import decode_node, decode_pod
from shared.shard import shard_of

log = logging.getLogger(__name__)

SCAN_COUNT = 1000


@dataclass(frozen=True, slots=True)
class Placement:
    """Where an allocation's index entries live (derived from its handle and GC attributes)."""

    handle: str
    node: str
    shard: int | None
    pod: str | None
    vm: str | None = None  # `<ns>/<vmi-name>` of a VM allocation

    @classmethod
    def of(cls, slot: Slot, shards: int) -> Placement:
        node = sys.intern(slot.attrs.get(ATTR_NODE, ""))  # one string per node, not per allocation
        ns, name = slot.attrs.get(ATTR_NAMESPACE, ""), slot.attrs.get(ATTR_POD, "")
        vmi = slot.attrs.get(ATTR_VMI_NAME, "")
        return cls(
            handle=sanitize_handle(slot.handle),
            node=node,
            shard=shard_of(node, shards) if node else None,
            pod=pod_key(ns, name) if node and ns and name else None,
            vm=pod_key(ns, vmi) if node and ns and vmi else None,
        )


@dataclass(slots=True)
class HeldBlock:
    """One block as the watcher holds it: the lean record of its last event (attribute bytes compared, not
    decoded, on the next), each tracked ordinal's slot packed as `P:blocks` stores it (`encode_slot`;
    re-packed only when it changed), and its tracked allocations per `node` attribute (Calico's gauges;
    "" for none)."""

    lean: LeanBlock
    packed: dict[int, bytes]
    nodes: dict[str, int]

    @property
    def host(self) -> str | None:
        return self.lean.host

    @property
    def in_use(self) -> int:
        return self.lean.in_use


# An indexed allocation: (block CIDR, ordinal, shard).  The CIDR is the string that keys `Memory.blocks`.
Ref = tuple[str, int, int]
# A key's refs, flat: (cidr, ordinal, shard, cidr, ordinal, shard, …): one tuple per pod, not one more
# per allocation (~7 MiB at 150k pods).  Read with `refs`.
Refs = tuple[str | int, ...]


def refs(flat: Refs) -> Iterator[Ref]:
    """The refs of a flat tuple, in order (str, int, int by construction: `_add`)."""
    return cast(Iterator[Ref], zip(flat[0::3], flat[1::3], flat[2::3], strict=True))


# A mirrored pod as the watcher holds it: its record's fingerprint, `spec.nodeName`, the IPs it reports.
PodEntry = tuple[int, str, HeldIPs]


def pod_entry(record: bytes, node: str, held: HeldIPs) -> PodEntry:
    return (hash(record), sys.intern(node), held)  # the node string shared with every pod on the node


@dataclass(slots=True)
class Memory:
    """The watcher's copy of the mirror (see the module docstring).  Not thread-safe: publisher only."""

    shards: int
    blocks: dict[str, HeldBlock] = field(default_factory=dict)
    pod_allocs: dict[str, Refs] = field(default_factory=dict)
    vm_allocs: dict[str, Refs] = field(default_factory=dict)
    vms: dict[str, bytes] = field(default_factory=dict)  # the mirrored VM record
    vmis: dict[str, bytes] = field(default_factory=dict)  # the mirrored VMI record
    node_blocks: dict[str, set[str]] = field(default_factory=dict)
    pods: dict[str, PodEntry] = field(default_factory=dict)
    nodes: dict[str, bytes] = field(default_factory=dict)  # the node record (small: uid and a label)
    loaded: bool = False
    malformed: int = 0  # stored records that could not be read at load (skipped, rebuilt by the relist)
    # The first load found nothing mirrored (a watcher starting on an empty Redis): everything held since
    # was mirrored by this process.  Any later load (after a half-applied batch) clears it for good.
    fresh: bool = False
    loads: int = 0

    def clear(self) -> None:
        self.blocks.clear()
        self.pod_allocs.clear()
        self.vm_allocs.clear()
        self.vms.clear()
        self.vmis.clear()
        self.node_blocks.clear()
        self.pods.clear()
        self.nodes.clear()
        self.loaded = False

    # -- the indexes -------------------------------------------------------------------------------------

    def index(self, cidr: str, ordinal: int, p: Placement) -> None:
        """The allocation held at `cidr`'s `ordinal` names `p.pod` / `p.vm`."""
        if p.shard is None:
            return
        if p.pod is not None:
            _add(self.pod_allocs, p.pod, (cidr, ordinal, p.shard))
        if p.vm is not None:
            _add(self.vm_allocs, p.vm, (cidr, ordinal, p.shard))

    def unindex(self, cidr: str, ordinal: int, p: Placement) -> None:
        if p.shard is None:
            return
        if p.pod is not None:
            _remove(self.pod_allocs, p.pod, cidr, ordinal)
        if p.vm is not None:
            _remove(self.vm_allocs, p.vm, cidr, ordinal)

    def owned(self, index: dict[str, Refs], key: str) -> list[tuple[str, int]]:
        """The (allocation id, shard) of every allocation `index` lists under `key`, each id derived from
        the slot held at its ordinal (the index and the held slots change together, in `BlockDiff`)."""
        out: list[tuple[str, int]] = []
        for cidr, ordinal, shard in refs(index.get(key, ())):
            alloc_id = self.alloc_id_at(cidr, ordinal, key)
            if alloc_id is not None:
                out.append((alloc_id, shard))
        return out

    def alloc_id_at(self, cidr: str, ordinal: int, owner: str = "") -> str | None:
        """The id of the allocation held at `cidr`'s `ordinal` (None, logged, if none is held there)."""
        held = self.blocks.get(cidr)
        packed = held.packed.get(ordinal) if held is not None else None
        if packed is None:  # not reachable while the two change together; never a guessed id
            log.error(
                "index lists %s ordinal %d for %s, which the watcher does not hold", cidr, ordinal, owner
            )
            return None
        try:
            handle = decode_slot(packed).handle
        except RecordError as exc:
            log.error("held slot %s ordinal %d unreadable: %s", cidr, ordinal, exc)
            return None
        return allocation_id(handle, block_ip_text(cidr, ordinal))

    def set_host(self, cidr: str, old: str | None, new: str | None) -> None:
        if old == new:
            return
        if old is not None:
            cidrs = self.node_blocks.get(old)
            if cidrs is not None:
                cidrs.discard(cidr)
                if not cidrs:
                    del self.node_blocks[old]
        if new is not None:
            self.node_blocks.setdefault(new, set()).add(cidr)

    # -- rebuilding from Redis -----------------------------------------------------------------------------

    def load(self, client: redis.Redis, keys: Keys) -> None:
        """Rebuild from what Redis holds (a watcher's start, or after a half-applied batch)."""
        self.clear()
        for raw_cidr, data in client.hscan_iter(keys.blocks, count=BLOCK_SCAN_COUNT):
            rec = self._block(raw_cidr, data)
            if rec is None:
                continue
            self._hold(*rec)
        for raw_name, data in client.hscan_iter(keys.pods, count=SCAN_COUNT):
            if isinstance(raw_name, bytes) and isinstance(data, bytes):
                self.adopt_pod(raw_name.decode(errors="replace"), data)
        for raw_name, data in client.hscan_iter(keys.nodes, count=SCAN_COUNT):
            if isinstance(raw_name, bytes) and isinstance(data, bytes):
                self.nodes[raw_name.decode(errors="replace")] = data
        for table, key in ((self.vms, keys.vms), (self.vmis, keys.vmis)):
            for raw_name, data in client.hscan_iter(key, count=SCAN_COUNT):
                if isinstance(raw_name, bytes) and isinstance(data, bytes):
                    table[raw_name.decode(errors="replace")] = data
        self.loaded = True
        self.fresh = self.loads == 0 and not (self.blocks or self.pods or self.nodes or self.vms or self.vmis)
        self.loads += 1
        log.info(
            "mirror memory loaded from Redis: %d blocks, %d pods, %d nodes",
            len(self.blocks),
            len(self.pods),
            len(self.nodes),
        )

    def _hold(self, cidr: str, record: BlockRecord, packed: dict[int, bytes]) -> None:
        cidr = sys.intern(cidr)  # the same string keys the block and its index entries
        nodes: dict[str, int] = {}
        for slot in record.slots.values():
            node = slot.attrs.get(ATTR_NODE, "")
            nodes[node] = nodes.get(node, 0) + 1
        # No attribute bytes are known yet: the block's next event decodes every ordinal once.
        rv, uid, host, in_use = record.resource_version, record.uid, record.host, record.in_use
        lean = LeanBlock(rv, uid, host, in_use, None, {}, record.cooling_since)
        self.blocks[cidr] = HeldBlock(lean, packed, nodes)
        self.set_host(cidr, None, record.host)
        for ordinal, slot in record.slots.items():
            self.index(cidr, ordinal, Placement.of(slot, self.shards))

    # -- taking Redis's word for one record (the backstop's audit, `producer/backstop.py`) ----------------

    def adopt_block(self, cidr: str, data: bytes) -> None:
        """Hold block `cidr` as Redis holds it (`data`), so that the next relist diffs against that; an
        unreadable record is forgotten (the relist writes the block whole)."""
        self.forget_block(cidr)
        rec = self._block(cidr.encode(), data)
        if rec is not None:
            self._hold(*rec)

    def forget_block(self, cidr: str) -> None:
        """Hold nothing of block `cidr` (its index entries go with it): its next event or relist is new."""
        held = self.blocks.pop(cidr, None)
        if held is None:
            return
        for ordinal, packed in held.packed.items():
            try:
                self.unindex(cidr, ordinal, Placement.of(decode_slot(packed), self.shards))
            except RecordError:
                continue
        self.set_host(cidr, held.host, None)

    def adopt_pod(self, name: str, data: bytes) -> None:
        try:
            pod = decode_pod("", "", data)
            node, held = pod.node_name, held_ips(pod)
        except RecordError:
            node, held = "", None
        self.pods[sys.intern(name)] = pod_entry(data, node, held)

    def adopt_node(self, name: str, data: bytes) -> None:
        self.nodes[name] = data

    def _block(self, raw_cidr: object, data: object) -> tuple[str, BlockRecord, dict[int, bytes]] | None:
        try:
            if not isinstance(raw_cidr, bytes) or not isinstance(data, bytes):
                raise WrongRecordShape("block", "not a bytes field")
            cidr = raw_cidr.decode()
            net = parse_network(cidr)
            if str(net) != cidr:
                raise WrongRecordShape("block", f"field {cidr!r} is not a canonical CIDR")
            rec, packed = decode_block_packed(data)
            size = block_size(net)
            if any(not 0 <= o < size for o in rec.slots):  # forged or corrupt: no IP to diff against
                raise WrongRecordShape("block", f"an ordinal outside {cidr}")
            return cidr, rec, packed
        except (RecordError, AddressError, UnicodeDecodeError, ValueError) as exc:
            self.malformed += 1
            log.warning("stored block record unreadable, rebuilding it from the cluster: %s", exc)
            return None


def _add(index: dict[str, Refs], key: str, ref: Ref) -> None:
    owned = index.get(key)
    if owned is None:  # most keys: a pod's first allocation (its refs were 5 % of a cold start's samples)
        index[sys.intern(key)] = ref
    elif all(r[:2] != ref[:2] for r in refs(owned)):
        # Interned: the same `<ns>/<name>` keys `Memory.pods`, one string for both (~9 MiB at 150k pods).
        index[sys.intern(key)] = (*owned, *ref)  # most pods and VMs own 1 or 2 IPs


def _remove(index: dict[str, Refs], key: str, cidr: str, ordinal: int) -> None:
    owned = index.get(key)
    if owned is not None:
        left = tuple(x for r in refs(owned) if r[0] != cidr or r[1] != ordinal for x in r)
        if left:
            index[key] = left
        else:
            del index[key]


def same_node_uid(before: bytes, after: bytes) -> bool:
    """Whether two node records name the same node incarnation (unreadable: assume not)."""
    try:
        return decode_node("", before).uid == decode_node("", after).uid
    except RecordError:
        return False
