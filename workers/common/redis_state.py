"""What a shard job reads from the mirror, decoded, each read one pipelined round trip.

Every ambiguity resolves to keeping the IP: an unreadable pod record is a pod that may exist
(`Lookup.UNKNOWN`), an unreadable node record a node that exists, unreadable state a datastore that is
not ready.  An unreadable allocation record is reported to the caller, which skips it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar, cast

import redis

from redisio.heldconn import HeldConnection, run
from shared import keys as k
from shared.blockrecords import decode_block_version
from shared.codec import RecordError
from shared.gcrecords import Candidate, Decided, decode_candidate, decode_decided
from shared.keys import Keys, ShardKeys
from shared.model import Allocation
from shared.records import decode_allocation, decode_pod, decode_vm, decode_vmi
from shared.verdicts import KubeVirtView, Lookup, PodView

log = logging.getLogger("workers.redis_state")  # its pre-split name (#37): log lines unchanged
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class GlobalState:
    grace: float | None  # leak grace period, seconds; None = unset
    datastore_ready: bool
    synced: bool
    problem: str | None = None  # an unreadable field: do nothing until it is fixed
    # KubeVirt's VMs and VMIs are mirrored (`state.kubevirt`): the VM rule applies.  Else every VM
    # allocation is valid (`kubevirt-absent`), as in Calico before its KubeVirt informers have synced.
    kubevirt: bool = False
    # When the grace period last changed (epoch s, Redis's clock; 0: never): a leak timer started before
    # it counts from it, as Calico's restart on a configuration change starts every timer again.
    grace_since: float = 0.0

    @property
    def ready(self) -> bool:
        return self.datastore_ready and self.synced and self.problem is None


STATE_FIELDS = (
    k.STATE_GRACE,
    k.STATE_DATASTORE_READY,
    k.STATE_SYNCED,
    k.STATE_KUBEVIRT,
    k.STATE_GRACE_SINCE,
)


def read_state(client: redis.Redis, keys: Keys) -> GlobalState:
    return parse_state(client.hmget(keys.state, list(STATE_FIELDS)))


def parse_state(values: Sequence[bytes | str | None]) -> GlobalState:
    """The reply of `HMGET state *STATE_FIELDS` (also sent inside a pipeline by the lingering jobs)."""
    grace_raw, ready_raw, synced_raw, kubevirt_raw, since_raw = values
    grace: float | None = None
    problem = None
    if grace_raw is not None:
        try:
            grace = float(grace_raw)
        except ValueError:
            problem = f"{k.STATE_GRACE} is {grace_raw!r}"
        else:
            if not grace >= 0:  # also rejects NaN
                problem = f"{k.STATE_GRACE} is {grace_raw!r}"
    since = 0.0
    if since_raw is not None:
        try:
            since = float(since_raw)
        except ValueError:
            since = math.nan
        if not math.isfinite(since):  # unreadable: no timer can be trusted to have run its course
            problem = f"{k.STATE_GRACE_SINCE} is {since_raw!r}"
            since = 0.0
    return GlobalState(grace, ready_raw == b"1", synced_raw == b"1", problem, kubevirt_raw == b"1", since)


@dataclass(frozen=True, slots=True)
class Entry:
    """One allocation id of a batch, as stored in its shard."""

    alloc: Allocation | None  # None: vanished (or unreadable, see `error`)
    error: RecordError | None
    candidate: Candidate | None
    candidate_stored: bool  # a candidate field exists (possibly unreadable)
    decided: Decided | None
    decided_stored: bool


@dataclass(frozen=True, slots=True)
class World:
    """Node existence and pod lookups for one batch."""

    node_exists: dict[str, bool]
    pods: dict[str, PodView]
    malformed: int  # node or pod records that could not be decoded (treated as existing / unknown)


class ShardReader:
    def __init__(
        self, client: redis.Redis, keys: Keys, shard: int, held: HeldConnection | None = None
    ) -> None:
        self.redis = client
        self.held = held  # a lingering job's kept connection (`redisio.heldconn`), for `world`
        self.keys = keys
        self.sk: ShardKeys = keys.shard(shard)
        self.shard = shard

    def entries(self, ids: Sequence[str]) -> dict[str, Entry]:
        """Allocation record, candidate timer and decided marker of each id (HMGET ×3, one round trip)."""
        if not ids:
            return {}
        pipe = self.redis.pipeline(transaction=False)
        self.queue_entries(pipe, ids)
        return self.parse_entries(ids, pipe.execute())

    def queue_entries(self, pipe: redis.client.Pipeline, ids: Sequence[str]) -> int:
        """`entries`' reads added to `pipe` (several shards' batches read in one round trip); returns how
        many replies they take (0 for no ids)."""
        if not ids:
            return 0
        pipe.hmget(self.sk.alloc, ids)
        pipe.hmget(self.sk.cand, ids)
        pipe.hmget(self.sk.decided, ids)
        return 3

    def parse_entries(self, ids: Sequence[str], replies: Sequence[object]) -> dict[str, Entry]:
        """`entries` from the replies of `queue_entries`."""
        if not ids:
            return {}
        allocs, cands, decideds = cast(
            "tuple[list[bytes | None], list[bytes | None], list[bytes | None]]", replies
        )
        out: dict[str, Entry] = {}
        for alloc_id, raw_alloc, raw_cand, raw_dec in zip(ids, allocs, cands, decideds, strict=True):
            alloc: Allocation | None = None
            error: RecordError | None = None
            if raw_alloc is not None:
                try:
                    alloc = decode_allocation(alloc_id, raw_alloc)
                except RecordError as exc:
                    error = exc
            out[alloc_id] = Entry(
                alloc,
                error,
                self._optional(decode_candidate, alloc_id, raw_cand),
                raw_cand is not None,
                self._optional(decode_decided, alloc_id, raw_dec),
                raw_dec is not None,
            )
        return out

    def _optional(self, decode: Callable[[bytes], T], alloc_id: str, raw: bytes | None) -> T | None:
        if raw is None:
            return None
        try:
            return decode(raw)
        except RecordError as exc:
            log.warning("unreadable timer record, restarting it: %s", exc, extra={"alloc": alloc_id})
            return None

    def world(self, nodes: Iterable[str], pod_keys: Iterable[str]) -> World:
        """HMGET nodes and pods in one round trip."""
        node_list = sorted(set(nodes))
        pod_list = sorted(set(pod_keys))
        pipe = self.redis.pipeline(transaction=False)
        if node_list:
            pipe.hmget(self.keys.nodes, node_list)
        if pod_list:
            pipe.hmget(self.keys.pods, pod_list)
        replies = run(pipe, self.held) if len(pipe) else []
        raw_nodes = replies.pop(0) if node_list else []
        raw_pods = replies.pop(0) if pod_list else []
        # A node record that exists counts, readable or not (an unreadable node is assumed to exist).
        exists = {n: raw is not None for n, raw in zip(node_list, raw_nodes, strict=True)}
        malformed = 0
        pods: dict[str, PodView] = {}
        for key, raw in zip(pod_list, raw_pods, strict=True):
            if raw is None:
                pods[key] = Lookup.MISSING  # callers only read pods once the mirror is synced
                continue
            ns, _, name = key.partition("/")
            try:
                pods[key] = decode_pod(ns, name, raw)
            except RecordError as exc:
                malformed += 1
                pods[key] = Lookup.UNKNOWN
                log.warning("unreadable pod record, assuming the pod exists: %s", exc, extra={"pod": key})
        return World(exists, pods, malformed)

    def kubevirt(self, vm_keys: Iterable[str]) -> tuple[KubeVirtView | None, int]:
        """The VM rule's view of the VMs named (`<ns>/<vmi-name>`): `state.kubevirt`, HMGET `vms` and
        `vmis` in one MULTI (the watcher clears the flag before it deletes the records, so a view is never
        read from a half-deleted mirror); None when the flag is not set.  Returns it and the count of
        unreadable records (their VMs are `unknown`: kept)."""
        wanted = sorted(set(vm_keys))
        if not wanted:
            return KubeVirtView(frozenset(), {}), 0
        pipe = self.redis.pipeline(transaction=True)
        pipe.hget(self.keys.state, k.STATE_KUBEVIRT)
        pipe.hmget(self.keys.vms, wanted)
        pipe.hmget(self.keys.vmis, wanted)
        flag, raw_vms, raw_vmis = pipe.execute()
        if flag != b"1":
            return None, 0
        present: set[tuple[str, str]] = set()
        owned: dict[tuple[str, str], bool] = {}
        unknown: set[tuple[str, str]] = set()
        for key, raw_vm, raw_vmi in zip(wanted, raw_vms, raw_vmis, strict=True):
            ns, _, name = key.partition("/")
            try:
                if raw_vm is not None:
                    decode_vm(raw_vm)
                    present.add((ns, name))
                elif raw_vmi is not None:
                    owned[(ns, name)] = decode_vmi(raw_vmi)
            except RecordError as exc:
                unknown.add((ns, name))
                log.warning("unreadable VM or VMI record, assuming the VM exists: %s", exc, extra={"vm": key})
        return KubeVirtView(frozenset(present), owned, frozenset(unknown)), len(unknown)

    def node_members(self, nodes: Sequence[str]) -> dict[str, list[str]]:
        """Every allocation id of each node (SMEMBERS nodeallocs), one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        for node in nodes:
            pipe.smembers(self.keys.nodeallocs(self.shard, node))
        return {
            node: sorted(m.decode(errors="replace") for m in members)  # junk: read as vanished
            for node, members in zip(nodes, pipe.execute(), strict=True)
        }

    def block_versions(self, cidrs: Iterable[str]) -> dict[str, str]:
        """resourceVersion of each block as mirrored ("" when absent or unreadable)."""
        wanted = sorted(set(cidrs))
        if not wanted:
            return {}
        out: dict[str, str] = {}
        for cidr, raw in zip(wanted, self.redis.hmget(self.keys.blocks, wanted), strict=True):
            out[cidr] = ""
            if isinstance(raw, bytes):
                try:
                    out[cidr] = decode_block_version(raw)
                except RecordError as exc:
                    log.warning("unreadable block record: %s", exc, extra={"block": cidr})
        return out
