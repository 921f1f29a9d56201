"""Release IPs as Calico's IPAM library does (`ReleaseIPs`, spec §3.13): per block, conditionally.

For each block: GET it (absent or soft-deleted: every request of it is already free); apply
`shared.blockops.release` with each request's (ip, handle, sequence number) — all or nothing per block;
write the result back with the resourceVersion read (409: re-read and re-evaluate, up to 100 times as
the library does); an unaffine block that becomes empty — Windows-reserved ordinals aside, as the library
counts (`blockops.deleted_by_release`) — is soft-deleted (`deleted: true` by a conditional replace) and
then deleted with preconditions (uid + resourceVersion).  Only after the block write, each
IPAMHandle's per-block count is decremented (CAS; the handle is soft-deleted and deleted when its map
empties; a missing handle is tolerated, #3940; failures are only logged, as the library does).

A `ReleaseConflict` (bad sequence number or handle) means the IP was re-used or the decision is stale:
that request is dropped — never retried as is; the watcher re-dirties the allocation from the new block
state — and the block's other requests go ahead.  Every Kubernetes write is preceded by `guard()` (the
leader's fence).  A handle decrement completes a block write already made under the fence and is itself
a CAS, so it is not fenced again: skipping it would leave the handle's count wrong for good.

Kept apart, so that this module is the block write alone: the IPAMHandle decrement
(`workers.leader.handle_count`), the live re-check before a release (`workers.leader.recheck`), the
releases-per-second limit (`workers.leader.rate_limit`) and the API protocol shared with the other writers
(`workers.leader.calico_objects`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from kubeio.errors import ApiUnavailable, Conflict, KubeError, NotFound
from shared import blockops
from shared.blockrecords import gc_attrs
from shared.errors import MalformedObject
from shared.model import IPAMBlock, sanitize_handle
from shared.names import handle_name
from shared.netaddr import AddressError, cidr_to_name, ip_to_ordinal, ordinal_to_ip
from shared.parse import parse_block, parse_handle
from workers.leader.audit import Result
from workers.leader.calico_objects import BLOCKS, HANDLES, MAX_CAS_ATTEMPTS, ObjectApi, soft_delete_and_delete
from workers.leader.handle_count import HandleCountMismatch, decrement_handle
from workers.leader.kube import JsonObj

log = logging.getLogger("workers.release")  # its pre-split name (#37): log lines unchanged


@dataclass(frozen=True, slots=True)
class Request:
    key: str  # the caller's id for it (the decision's stream id)
    ip: str
    handle: str
    sequence_number: int
    block: str  # block CIDR
    # The allocation's GC attributes as decided on (the mirror's): the live block must hold the same, or
    # the re-check judged another owner than the IP's (a forged or corrupt mirror record).
    attrs: Mapping[str, str] | None = None

    def blockops(self) -> blockops.ReleaseRequest:
        return blockops.ReleaseRequest(self.ip, self.handle, self.sequence_number)


@dataclass(frozen=True, slots=True)
class Outcome:
    result: Result  # RELEASED, ALREADY_FREE, REFUSED_CONFLICT or ERROR
    reason: str


class BlockReleaser:
    """One pass of releases.  `read` fetches blocks (cached for the first write attempt), `conflicts`
    tells which requests a block refuses, `release` writes."""

    def __init__(
        self,
        api: ObjectApi,
        guard: Callable[[], None],
        attempts: int = MAX_CAS_ATTEMPTS,
        *,
        cooldown: int = 0,
        now: float | None = None,
    ) -> None:
        self.api = api
        self.guard = guard
        self.attempts = attempts
        # IPAMConfig `ipCooldownSeconds` (> 0: released ordinals are parked, `shared.blockops`) and the
        # wall time their `releasedAt` says; with `now`, every written block is normalized as the library's.
        self.cooldown = cooldown
        self.now = now
        self._blocks: dict[str, JsonObj | None] = {}
        # Each live block as read, parsed once (`_get`): the checks of a pass (handle all-or-none, the
        # live attributes of each IP) read it, not three parses of the same JSON per released IP.
        self._parsed: dict[int, tuple[JsonObj, IPAMBlock]] = {}
        # IPAMHandles read by `handle_others`, reused by the decrement after the block write (its PUT is
        # conditional on this read's resourceVersion: a handle changed since is re-read on the 409).
        self._handles: dict[str, JsonObj] = {}

    def _get(self, cidr: str) -> JsonObj | None:
        """The live block, or None when it does not exist (or is soft-deleted: treated as absent)."""
        try:
            obj = self.api.get(BLOCKS, cidr_to_name(cidr))
        except NotFound:
            return None
        parsed = parse_block(obj)  # MalformedObject: never written from
        if obj["spec"].get("deleted"):
            return None
        # Keyed by the object, which is held with it (so its id cannot be reused): a re-read block is
        # parsed anew.
        self._parsed[id(obj)] = (obj, parsed)
        return obj

    def _typed(self, obj: JsonObj) -> IPAMBlock:
        held = self._parsed.get(id(obj))
        return held[1] if held is not None and held[0] is obj else parse_block(obj)

    def read(self, cidrs: Iterable[str]) -> None:
        """Fetch blocks; one that cannot be read is not cached (`release` reads it again and reports)."""
        for cidr in sorted(set(cidrs) - set(self._blocks)):
            try:
                self._blocks[cidr] = self._get(cidr)
            except (MalformedObject, KubeError) as exc:
                log.warning("block not readable: %s", exc, extra={"block": cidr})

    def conflicts(self, requests: Iterable[Request]) -> dict[str, str]:
        """key → why, for every request whose block (as read) refuses it; unread blocks are read."""
        reqs = list(requests)
        self.read(r.block for r in reqs)
        out: dict[str, str] = {}
        for r in reqs:
            obj = self._blocks.get(r.block)
            if obj is None:
                continue
            try:
                blockops.release(obj["spec"], [r.blockops()])
            except blockops.ReleaseConflict as exc:
                out[r.key] = str(exc)
                continue
            live = _live_attrs(self._typed(obj), r.ip)
            if r.attrs is not None and live is not None and live != dict(r.attrs):
                out[r.key] = f"attributes of {r.ip} in the live block are {live}, not {dict(r.attrs)}"
        return out

    def handle_others(self, handle: str, ips: set[str]) -> list[str]:
        """IPs other than `ips` that the live blocks hold for `handle` (all-or-none, #5044, checked on
        the API rather than on the mirror's handle index): the blocks its IPAMHandle names, read live.
        A missing IPAMHandle (#3940) names none.  MalformedObject/KubeError propagate."""
        name = handle_name(sanitize_handle(handle))
        try:
            obj = self.api.get(HANDLES, name)
        except NotFound:
            return []
        cidrs = sorted(parse_handle(obj).block)
        self._handles[name] = obj
        self.read(cidrs)
        others: list[str] = []
        for cidr in cidrs:
            block = self._blocks.get(cidr)
            if block is None and cidr not in self._blocks:
                raise ApiUnavailable(f"block {cidr} of handle {handle} could not be read")
            if block is None:
                continue
            others.extend(ip for ip in self._typed(block).ips_of(handle) if ip not in ips)
        return others

    def release(self, requests: Iterable[Request]) -> dict[str, Outcome]:
        by_block: dict[str, list[Request]] = {}
        for r in requests:
            by_block.setdefault(r.block, []).append(r)
        out: dict[str, Outcome] = {}
        for cidr, reqs in sorted(by_block.items()):
            out.update(self._release_block(cidr, reqs))
        return out

    def _release_block(self, cidr: str, reqs: list[Request]) -> dict[str, Outcome]:
        extra = {"block": cidr}
        out: dict[str, Outcome] = {}
        pending = list(reqs)
        try:
            obj = self._blocks.pop(cidr) if cidr in self._blocks else self._get(cidr)
            for _ in range(self.attempts):
                if obj is None:
                    out.update({r.key: Outcome(Result.ALREADY_FREE, "block not found") for r in pending})
                    return out
                outcome, pending = self._apply(obj["spec"], pending, out, self.cooldown, self.now)
                if outcome is None:
                    return out
                if not outcome.written:
                    out.update({r.key: Outcome(Result.ALREADY_FREE, "ordinal already free") for r in pending})
                    return out
                body = {**obj, "spec": outcome.spec}
                try:
                    if outcome.deletes_block:
                        soft_delete_and_delete(self.api, BLOCKS, body, self.guard)
                    else:
                        self.guard()
                        self.api.replace(BLOCKS, body)
                except (Conflict, NotFound) as exc:
                    log.info("block changed under the release, re-reading: %s", exc, extra=extra)
                    obj = self._get(cidr)
                    continue
                freed = set(outcome.released)
                for r in pending:
                    if r.ip in freed:
                        out[r.key] = Outcome(Result.RELEASED, "released")
                    else:
                        out[r.key] = Outcome(Result.ALREADY_FREE, "ordinal already free")
                self._decrement_handles(cidr, outcome.handle_counts)
                return out
        except MalformedObject as exc:
            log.error("block unreadable, nothing released from it: %s", exc, extra=extra)
            out.update({r.key: Outcome(Result.ERROR, f"block unreadable: {exc}") for r in pending})
            return out
        except KubeError as exc:
            log.warning("release from block failed: %s", exc, extra=extra)
            out.update({r.key: Outcome(Result.ERROR, str(exc)) for r in pending})
            return out
        out.update({r.key: Outcome(Result.ERROR, "too many conflicts") for r in pending})
        return out

    @staticmethod
    def _apply(
        spec: blockops.Spec,
        pending: list[Request],
        out: dict[str, Outcome],
        cooldown: int = 0,
        now: float | None = None,
    ) -> tuple[blockops.ReleaseOutcome | None, list[Request]]:
        """Release what the block accepts; refused requests go to `out` as conflicts (dropped)."""
        while pending:
            try:
                requests = [r.blockops() for r in pending]
                return blockops.release(spec, requests, cooldown=cooldown, now=now), pending
            except blockops.ReleaseConflict:
                kept = []
                for r in pending:
                    try:
                        blockops.release(spec, [r.blockops()])
                        kept.append(r)
                    except blockops.ReleaseConflict as exc:
                        out[r.key] = Outcome(Result.REFUSED_CONFLICT, str(exc))
                pending = kept
        return None, pending

    def _decrement_handles(self, cidr: str, counts: Mapping[str, int]) -> None:
        for handle, n in sorted(counts.items()):
            try:
                read = self._handles.pop(handle_name(sanitize_handle(handle)), None)
                decrement_handle(self.api, handle, cidr, n, self.attempts, read=read)
            except (KubeError, MalformedObject, HandleCountMismatch) as exc:
                log.warning("handle count not decremented: %s", exc, extra={"handle": handle, "block": cidr})


def _live_attrs(block: IPAMBlock, ip: str) -> dict[str, str] | None:
    """The GC attributes the live block holds for `ip` (None: the ordinal is free or has no handle, or
    `ip` is not in the block)."""
    try:
        ordinal = ip_to_ordinal(block.cidr, ip)
    except AddressError:
        return None
    if ordinal >= len(block.allocations) or str(ordinal_to_ip(block.cidr, ordinal)) != ip:
        return None  # as the ordinal's own IP, written as the block writes it, or not at all
    index = block.allocations[ordinal]
    if index is None:
        return None
    attr = block.attributes[index]
    return None if attr.handle_id is None else gc_attrs(attr.secondary)
