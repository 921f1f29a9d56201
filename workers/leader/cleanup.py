"""Blocks and affinities: release empty blocks of live nodes, and everything of deleted nodes (§3.10–§3.11).

Both go through Calico's `ReleaseBlockAffinity(block, mustBeEmpty=true)` (spec §3.13), here
`release_block_affinity`: GET the affinity and the block; no block → the affinity is left as it is (as
Calico leaves it); the block normalized as the library reads it (ordinals whose IP cooldown is over are
free); a block affine to another host → delete the stale affinity (an unaffine block is not
another host's: it goes on as the host's own, as in the library); must-be-empty and the block
holds anything but Windows-reserved ordinals → "block is not empty" (`BlockNotEmpty`), nothing
written; affinity →
`pendingDeletion` (CAS); block deleted if empty (soft delete + preconditioned delete) or its
`affinity`/`affinityClaimTime` cleared (CAS) if not; affinity deleted with preconditions. The GC always
asks must-be-empty, so a deleted node's block that still holds borrowed IPs of live pods keeps its
affinity: the node stays pending and is retried with a per-node exponential back-off (5 ms → 30 s,
Calico's retry controller) without holding up anything else (#8643, #11906).

- `DeletedNodes`: nodes whose blocks the watcher put in `dirtyblocks:{s}` (node deleted), or whose host
  blocks outlived them (`orphans`: the empty-block pass and its backstop scan find those).  A pass costs
  what is pending, not the cluster: 16 SMEMBERS of `dirtyblocks`, then the block records, node records
  and `nodeallocs` of the pending nodes only.  A node is cleaned once nothing of it is left
  (`nodeallocs` empty, or only allocations this leader has just released — its tunnel IPs are decided only
  then) and a live GET confirms it is still gone (§8.4: a node re-created with the same name keeps its
  blocks).  Its affinities are found by the `projectcalico.org/hostname-hash` label, as Calico does.
- `EmptyBlocks` (`workers/leader/empty_blocks.py`): empty blocks of live nodes, from the watcher's `P:empty`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

import redis

from kubeio.errors import Conflict, KubeError, NotFound
from shared.blockops import json_copy, library_empty, normalized
from shared.blockrecords import BlockHead, BlockRecord, decode_block_head
from shared.codec import RecordError
from shared.errors import MalformedObject, TransientError
from shared.keys import Keys
from shared.names import LABEL_AFFINITY_TYPE, LABEL_HOSTNAME_HASH, affinity_name, hostname_hash
from shared.netaddr import AddressError, cidr_to_name, parse_network
from shared.parse import parse_affinity, parse_block
from shared.shard import shard_of
from workers.leader.audit import AuditRecord, Result
from workers.leader.calico_objects import BLOCKS, MAX_CAS_ATTEMPTS, ObjectApi, soft_delete_and_delete
from workers.leader.kube import JsonObj

log = logging.getLogger("workers.cleanup")  # its pre-split name (#37): log lines unchanged

AFFINITIES = "blockaffinities"
BACKOFF_BASE_SECONDS = 0.005  # Calico's retry controller: 5 ms · 2^n …
BACKOFF_MAX_SECONDS = 30.0  # … capped at 30 s


class BlockNotEmpty(TransientError):
    """Must-be-empty affinity release of a block that still holds allocations (Calico's errBlockNotEmpty)."""


class Done(StrEnum):
    RELEASED = "released"  # block deleted (or its affinity cleared) and the affinity deleted
    OTHER_HOST = "claimed-by-other-host"  # the block is affine to another host: stale affinity deleted
    NO_BLOCK = "block-not-found"  # the affinity outlived its block: left as it is, as Calico does
    NO_AFFINITY = "affinity-not-found"
    CLAIMING = "claim-in-progress"  # a `pending` affinity without a block: a claim in flight, left alone


def release_block_affinity(
    api: ObjectApi,
    host: str,
    cidr: str,
    guard: Callable[[], None],
    must_be_empty: bool = True,
    attempts: int = MAX_CAS_ATTEMPTS,
    *,
    cooldown: int | None = None,
    now: float | None = None,
) -> Done:
    """Calico's `ReleaseBlockAffinity` for `host` and block `cidr` (see the module docstring).

    `cooldown` (the live IPAMConfig's, as the library reads it for each call) and `now`: the block read
    is normalized first, as the library's `blockFromBackend` does, so ordinals whose cooldown is over are
    free to "must be empty", and what is written is the normalized block.  Without them the block is
    judged and written as read (a cooling ordinal, aged or not, is in use)."""
    name = affinity_name(host, parse_network(cidr))
    for _ in range(attempts):
        try:
            aff = api.get(AFFINITIES, name)
        except NotFound:
            return Done.NO_AFFINITY
        parse_affinity(aff)
        try:
            block: JsonObj | None = api.get(BLOCKS, cidr_to_name(cidr))
        except NotFound:
            block = None
        try:
            if block is None or block["spec"].get("deleted"):
                # Calico's library returns "does not exist" here and the GC ignores it: the affinity
                # stays (a node re-created under its name claims the block again from it).
                return Done.CLAIMING if aff["spec"].get("state") == "pending" else Done.NO_BLOCK
            parse_block(block)
            # The block as the library reads it: normalized (`blockFromBackend`), then judged.
            body = {**block, "spec": normalized(block["spec"], cooldown, now)}
            spec = body["spec"]
            affinity = spec.get("affinity")
            if affinity is not None and affinity != f"host:{host}":
                _delete(api, AFFINITIES, aff, guard)
                return Done.OTHER_HOST
            # An unaffine block (no `affinity`) carries on, as libcalico-go's `releaseBlockAffinity`
            # does (`b.Affinity != nil && !affinityMatches`): refused if it must be empty and is not, else
            # deleted if empty, and the affinity deleted.  Refused, nothing is written: an affinity an
            # earlier attempt left `pendingDeletion` stays so, as in Calico (its host confirms it again
            # on its next assignment from it, `getBlockFromAffinity`).
            if must_be_empty and not library_empty(spec):
                used = sum(1 for i in spec.get("allocations") or [] if i is not None)
                raise BlockNotEmpty(f"block {cidr} is not empty ({used} ordinals in use)")
            if aff["spec"].get("state") != "pendingDeletion":
                aff = _set_state(api, aff, "pendingDeletion", guard)
            if library_empty(spec):
                soft_delete_and_delete(api, BLOCKS, body, guard)
            else:
                spec["affinity"] = None
                spec.pop("affinityClaimTime", None)
                guard()
                api.replace(BLOCKS, body)
            _delete(api, AFFINITIES, aff, guard)
            return Done.RELEASED
        except Conflict as exc:
            log.info(
                "affinity release raced a writer, retrying: %s", exc, extra={"node": host, "block": cidr}
            )
            continue
    raise TransientError(f"affinity {name}: still conflicting after {attempts} attempts")


def _set_state(api: ObjectApi, aff: JsonObj, state: str, guard: Callable[[], None]) -> JsonObj:
    body = json_copy(aff)
    body["spec"]["state"] = state
    guard()
    return api.replace(AFFINITIES, body)


def _delete(api: ObjectApi, plural: str, obj: JsonObj, guard: Callable[[], None]) -> None:
    meta = obj["metadata"]
    guard()
    with contextlib.suppress(NotFound):
        api.delete(plural, meta["name"], str(meta.get("uid") or ""), str(meta.get("resourceVersion") or ""))


def host_affinity_cidrs(api: ObjectApi, host: str) -> list[str]:
    """The CIDRs of `host`'s BlockAffinities (IPv4 and IPv6), found by label as Calico does."""
    selector = f"{LABEL_HOSTNAME_HASH}={hostname_hash(host)},{LABEL_AFFINITY_TYPE}=host"
    cidrs = []
    for raw in api.list(AFFINITIES, selector):
        aff = parse_affinity(raw)
        if aff.node == host:  # the label is a hash: check the name it stands for
            cidrs.append(str(aff.cidr))
    return sorted(cidrs)


@dataclass(slots=True)
class NodeBackoff:
    """Per-node exponential back-off of failed node cleanups (Calico's per-key retry, #8643)."""

    base: float = BACKOFF_BASE_SECONDS
    cap: float = BACKOFF_MAX_SECONDS
    _failures: dict[str, int] = field(default_factory=dict)
    _next: dict[str, float] = field(default_factory=dict)

    def ready(self, node: str, now: float) -> bool:
        return now >= self._next.get(node, float("-inf"))

    def failed(self, node: str, now: float) -> float:
        n = self._failures.get(node, 0)
        delay = min(self.cap, self.base * 2.0 ** min(n, 64))
        self._failures[node] = n + 1
        self._next[node] = now + delay
        return delay

    def succeeded(self, node: str) -> None:
        self._failures.pop(node, None)
        self._next.pop(node, None)

    def failures(self, node: str) -> int:
        return self._failures.get(node, 0)


@dataclass(frozen=True, slots=True)
class Context:
    """What both passes need from the leader."""

    redis: redis.Redis
    keys: Keys
    api: ObjectApi
    guard: Callable[[], None]  # the fence, before every Kubernetes write
    write: Callable[..., Any]  # the fenced Redis write (`Fence.write`)
    shards: int
    dry_run: bool
    record: Callable[[AuditRecord], None]  # queue an audit record (stamped by the leader)
    # The live IPAMConfig's cooldown, read for each affinity release as the library reads it (a
    # KubeError propagates: nothing released).  None: blocks are judged as read, not normalized.
    ip_cooldown: Callable[[], int] | None = None


R = TypeVar("R", BlockRecord, BlockHead)


def decode_blocks(
    raw: Iterable[tuple[bytes, bytes | None]], decode: Callable[[bytes], R]
) -> dict[str, R | None]:
    """CIDR → its record decoded with `decode` (`decode_block_head`: the host and in-use count only);
    None where the field is no block's CIDR or the record is unreadable (logged)."""
    out: dict[str, R | None] = {}
    for key, data in raw:
        cidr = key.decode(errors="replace")
        try:
            parse_network(cidr)  # a field that is not a block's CIDR (forged, corrupt) names no block
            out[cidr] = decode(data) if data is not None else None
        except (RecordError, AddressError) as exc:
            log.warning("unreadable block record: %s", exc, extra={"block": cidr})
            out[cidr] = None
    return out


class DeletedNodes:
    """Deleted-node cleanup (§3.11): every affinity of a gone, drained node, block by block."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.backoff = NodeBackoff()
        self.orphans: set[str] = set()  # gone hosts found by the empty-block pass (no dirtyblocks entry)
        self._reported: dict[str, str] = {}  # node → last failure recorded (one audit record per change)

    def _candidates(self) -> dict[str, set[str]]:
        """node → CIDRs of its `dirtyblocks` entries (plus orphans); drops entries with nothing behind."""
        ctx = self.ctx
        pipe = ctx.redis.pipeline(transaction=False)
        for s in range(ctx.shards):
            pipe.smembers(ctx.keys.dirtyblocks(s))
        members = [sorted(m.decode(errors="replace") for m in ms) for ms in pipe.execute()]
        wanted = sorted({c for ms in members for c in ms})
        raw = [reply_bytes(v) for v in ctx.redis.hmget(ctx.keys.blocks, wanted)] if wanted else []
        # The host alone decides here: the head, not every slot (hundreds of deleted nodes' blocks wait
        # at once under autoscaler churn, and this runs in every pass that released IPs).
        records = decode_blocks(zip((c.encode() for c in wanted), raw, strict=True), decode_block_head)
        out: dict[str, set[str]] = {node: set() for node in self.orphans}
        for s, cidrs in enumerate(members):
            stale = []
            for cidr in cidrs:
                rec = records.get(cidr)
                if rec is None or rec.host is None:
                    stale.append(cidr)  # block gone or no longer affine: nothing left to clean
                else:
                    out.setdefault(rec.host, set()).add(cidr)
            if stale and not ctx.dry_run:
                ctx.write("SREM", ctx.keys.dirtyblocks(s), *stale)
        return out

    def _forget(self, node: str, cidrs: set[str]) -> None:
        self.orphans.discard(node)
        self._reported.pop(node, None)
        if cidrs and not self.ctx.dry_run:
            self.ctx.write("SREM", self.ctx.keys.dirtyblocks(shard_of(node, self.ctx.shards)), *sorted(cidrs))

    def run(self, now: float, released: Container[str]) -> None:
        """One pass.  `released`: alloc ids this leader released recently (the mirror may lag)."""
        ctx = self.ctx
        candidates = self._candidates()
        if not candidates:
            return
        nodes = sorted(candidates)
        present = ctx.redis.hmget(ctx.keys.nodes, nodes)
        pipe = ctx.redis.pipeline(transaction=False)
        for node in nodes:
            pipe.smembers(ctx.keys.nodeallocs(shard_of(node, ctx.shards), node))
        members = pipe.execute()
        for node, record, allocs in zip(nodes, present, members, strict=True):
            cidrs = candidates[node]
            if record is not None:
                self._forget(node, cidrs)  # the node is back: the empty-block pass owns its blocks
                continue
            left = [m for m in allocs if m.decode(errors="replace") not in released]
            if left or not self.backoff.ready(node, now):
                continue  # allocations still on it (maybe in use), or backing off
            self._clean(node, cidrs, now)

    def _clean(self, node: str, cidrs: set[str], now: float) -> None:
        ctx = self.ctx
        extra = {"node": node}
        try:
            exists = self._node_exists(node)
            if exists:
                log.info("node is back: its blocks stay", extra=extra)
                self._forget(node, cidrs)
                return
            host_cidrs = host_affinity_cidrs(ctx.api, node)
            if ctx.dry_run:
                if self._reported.get(node) != "dry-run":
                    self._reported[node] = "dry-run"
                    for cidr in host_cidrs:
                        reason = "would release the node's affinity"
                        ctx.record(_block_record(Result.DRY_RUN, node, cidr, reason))
                return
            # Calico's `ReleaseHostAffinities` reads the IPAM config once for the host's blocks.
            cooldown = ctx.ip_cooldown() if ctx.ip_cooldown is not None and host_cidrs else None
            failure: Exception | None = None
            for cidr in host_cidrs:
                try:
                    done = release_block_affinity(ctx.api, node, cidr, ctx.guard, cooldown=cooldown, now=now)
                except (BlockNotEmpty, KubeError, MalformedObject, TransientError) as exc:
                    failure = exc  # Calico continues past a failing block and reports the last error
                    log.info("node affinity not released: %s", exc, extra={**extra, "block": cidr})
                    continue
                ctx.write("HDEL", ctx.keys.emptyblocks, cidr)
                ctx.record(_block_record(Result.RELEASED, node, cidr, str(done)))
            if failure is not None:
                raise failure
        except (BlockNotEmpty, KubeError, MalformedObject, TransientError) as exc:
            delay = self.backoff.failed(node, now)
            log.info("node cleanup failed, retrying in %.3fs: %s", delay, exc, extra=extra)
            why = str(exc)
            if self._reported.get(node) != why:
                self._reported[node] = why
                result = Result.REFUSED_VALID if isinstance(exc, BlockNotEmpty) else Result.ERROR
                ctx.record(_block_record(result, node, "", why, {"retry_in": delay}))
            return
        self.backoff.succeeded(node)
        self._forget(node, cidrs)
        log.info("deleted node cleaned up: %s affinities released", len(host_cidrs), extra=extra)

    def _node_exists(self, node: str) -> bool:
        """Live: only an authoritative 404 means gone (§8.4); other errors propagate (back-off)."""
        try:
            self.ctx.api.get_node(node)
        except NotFound:
            return False
        return True


def _block_record(
    result: Result, node: str, cidr: str, reason: str, evidence: dict[str, Any] | None = None
) -> AuditRecord:
    return AuditRecord(
        result=result, block=cidr, node=node, rule="node-missing", reason=reason, evidence=evidence or {}
    )


def reply_bytes(value: object) -> bytes | None:
    """Narrow a Redis reply (clients here run with `decode_responses=False`)."""
    return value if isinstance(value, bytes) else None
