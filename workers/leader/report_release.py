"""Releasing what an `ipamgc check --output json` report marked `release: now`, through the leader's guards
(`ipamgc release --from-report`, as `calicoctl ipam release --from-report`).

A report is only a proposal: nothing in it is trusted for a write.  Each IP goes through the leader's own
last steps before a release (`workers.leader.release`), with the report's sequence number in place of a
decision's:
1. the live block is read: its ordinal must still hold the report's handle with the report's sequence
   number, else the IP was released (`already-free`) or re-used (`refused-conflict`) since the report;
2. `Rechecker.check` re-validates the live allocation against the live API (`refused-valid` when in
   use); pods are read live even for a deleted node: a one-shot run has no mirror it could trust more;
3. handle all-or-none: a handle's IPs go together or not at all, and only when the live blocks hold no
   other IP of it (`BlockReleaser.handle_others`; `held-by-handle`);
4. `BlockReleaser.conflicts`, then `BlockReleaser.release`: per-block conditional writes (resourceVersion
   and the report's sequence numbers), then the IPAMHandle compare-and-swap.
`dry_run` stops before the writes of step 4 (`dry-run`: "would release" / "would refuse: …").  Every IP
gets exactly one audit record, appended to the audit stream (`ipamgc audit`) and returned.

There is no Lease and no fencing epoch (records carry epoch 0): this is an operator's one-shot command.
As with Calico's collector beside the leader, two writers are safe because every write is conditional:
whichever writes second conflicts, and its request is dropped, never retried as is.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from kubeio.errors import KubeError, NotFound
from shared.blockrecords import gc_attrs
from shared.cluster import ClusterIdentity
from shared.errors import MalformedObject
from shared.keys import Keys
from shared.model import Allocation, IPAMBlock, sanitize_handle
from shared.netaddr import cidr_to_name
from shared.parse import parse_block, parse_pod
from shared.verdicts import Lookup, PodView
from workers.leader.audit import AUDIT_MAXLEN, AuditRecord, Result, log_records, numbered
from workers.leader.audit_seq import AuditSequence
from workers.leader.calico_objects import BLOCKS, ObjectApi
from workers.leader.recheck import Recheck, Rechecker
from workers.leader.release import BlockReleaser, Request

log = logging.getLogger("workers.report_release")  # its pre-split name (#37): log lines unchanged

ACTOR = "ipamgc release --from-report"
# Results that stop the other IPs of the same handle (all-or-none): the handle is not entirely leaked.
_BLOCKING = frozenset({Result.REFUSED_CONFLICT, Result.REFUSED_VALID, Result.ERROR, Result.HELD_BY_HANDLE})


@dataclass(frozen=True, slots=True)
class ReportEntry:
    """One allocation a report marked `release: now`."""

    ip: str
    block: str
    handle: str
    node: str
    sequence_number: int
    reason: str  # the report's reason code: the rule that confirmed the leak


class LiveRechecker(Rechecker):
    """The leader's re-check, with the pod read live also when its node is gone (the leader reads its
    mirror then, as Calico reads its cache; a one-shot run has only the API)."""

    def _mirrored_pod(self, namespace: str, name: str) -> PodView:
        try:
            return parse_pod(self.api.get_pod(namespace, name))
        except NotFound:
            return Lookup.MISSING
        except (MalformedObject, KubeError):
            return Lookup.UNKNOWN  # cannot be judged: kept

    def check(self, a: Allocation) -> Recheck:
        verdict = super().check(a)
        if verdict.evidence.get("pod_source") == "mirror":
            verdict.evidence["pod_source"] = "live"
        return verdict


def release_report(
    entries: Sequence[ReportEntry],
    api: ObjectApi,
    client: redis.Redis,
    keys: Keys,
    *,
    dry_run: bool,
    report: Mapping[str, Any],
    clock: Callable[[], float] = time.time,
    cluster: ClusterIdentity | None = None,
) -> list[AuditRecord]:
    """Release `entries` as the module docstring says; one audit record per entry, in entry order,
    also appended to the audit stream.  `report`: what identifies the report, kept in each record."""
    done: dict[str, AuditRecord] = {}

    def settle(e: ReportEntry, result: Result, reason: str, evidence: Mapping[str, Any]) -> None:
        ev = {"report": {**report, "sequence_number": e.sequence_number}, **evidence}
        done[e.ip] = AuditRecord(
            result, e.ip, e.handle, e.block, e.node, e.reason, reason, ev, leader=ACTOR, at=clock()
        ).stamped(cluster)

    unique = list({e.ip: e for e in entries}.values())
    live = _live_allocations(api, unique, settle)
    recheck = LiveRechecker(api, client, keys)
    approved: dict[str, tuple[ReportEntry, Allocation, dict[str, Any]]] = {}
    for e in unique:
        if e.ip not in live:
            continue
        v = recheck.check(live[e.ip])
        if v.error:
            settle(e, Result.ERROR, v.error, {"recheck": v.evidence})
        elif v.valid:
            settle(e, Result.REFUSED_VALID, v.reason, {"recheck": v.evidence})
        else:
            approved[e.ip] = (e, live[e.ip], {"recheck": v.evidence})
    releaser = BlockReleaser(api, lambda: None)
    _all_or_none(unique, approved, done, releaser, settle)
    requests = {
        ip: Request(ip, e.ip, e.handle, e.sequence_number, e.block, gc_attrs(a.attrs))
        for ip, (e, a, _) in approved.items()
    }
    conflicts = releaser.conflicts(requests.values())
    if dry_run:
        for ip, (e, _, ev) in approved.items():
            why = f"would refuse: {conflicts[ip]}" if ip in conflicts else "would release"
            settle(e, Result.DRY_RUN, why, ev)
    else:
        for ip in conflicts:
            e, _, ev = approved.pop(ip)
            settle(e, Result.REFUSED_CONFLICT, conflicts[ip], ev)
        _all_or_none(unique, approved, done, None, settle)  # a conflict holds the rest of its handle
        outcomes = releaser.release(requests[ip] for ip in approved)
        for ip, (e, _, ev) in approved.items():
            settle(e, outcomes[ip].result, outcomes[ip].reason, ev)
    records, _ = numbered(client, keys, AuditSequence(), [done[e.ip] for e in unique])
    _append(client, keys, records)
    return records


def _live_allocations(
    api: ObjectApi,
    entries: Sequence[ReportEntry],
    settle: Callable[[ReportEntry, Result, str, Mapping[str, Any]], None],
) -> dict[str, Allocation]:
    """ip → the live allocation, for each entry whose live block still holds it as the report says."""
    blocks: dict[str, IPAMBlock | str | None] = {}  # CIDR → block, None (gone), or why it is unreadable
    for cidr in sorted({e.block for e in entries}):
        try:
            obj = api.get(BLOCKS, cidr_to_name(cidr))
            blocks[cidr] = None if (obj.get("spec") or {}).get("deleted") else parse_block(obj)
        except NotFound:
            blocks[cidr] = None
        except (MalformedObject, KubeError) as exc:
            blocks[cidr] = f"block not readable: {exc}"
    out: dict[str, Allocation] = {}
    for e in entries:
        block = blocks[e.block]
        if isinstance(block, str):
            settle(e, Result.ERROR, block, {})
            continue
        alloc = None if block is None else next((a for a in block.iter_allocations() if a.ip == e.ip), None)
        if alloc is None:
            settle(e, Result.ALREADY_FREE, "block not found" if block is None else "ordinal already free", {})
        elif sanitize_handle(alloc.handle) != sanitize_handle(e.handle):
            why = f"now held by handle {alloc.handle}, not the report's {e.handle}: re-used since the report"
            settle(e, Result.REFUSED_CONFLICT, why, {})
        elif alloc.sequence_number != e.sequence_number:
            why = (
                f"sequence number {alloc.sequence_number} since the report ({e.sequence_number}): "
                "re-used since the report"
            )
            settle(e, Result.REFUSED_CONFLICT, why, {})
        else:
            out[e.ip] = alloc
    return out


def _all_or_none(
    entries: Sequence[ReportEntry],
    approved: dict[str, tuple[ReportEntry, Allocation, dict[str, Any]]],
    done: Mapping[str, AuditRecord],
    releaser: BlockReleaser | None,
    settle: Callable[[ReportEntry, Result, str, Mapping[str, Any]], None],
) -> None:
    """Hold (drop from `approved`) every IP of a handle that is not entirely going: another IP of it in
    the report was refused, or (with `releaser`) the live blocks hold an IP of it the report does not."""
    by_handle: dict[str, list[ReportEntry]] = {}
    for e in entries:
        by_handle.setdefault(sanitize_handle(e.handle), []).append(e)
    for handle, members in sorted(by_handle.items()):
        going = [e for e in members if e.ip in approved]
        if not going:
            continue
        stopped = [e.ip for e in members if e.ip in done and done[e.ip].result in _BLOCKING]
        why = ""
        if stopped:
            why = f"another IP of the handle is not released: {', '.join(stopped[:5])}"
        elif releaser is not None:
            try:
                others = releaser.handle_others(handle, {e.ip for e in members})
            except (KubeError, MalformedObject) as exc:
                for e in going:
                    settle(e, Result.ERROR, f"handle not readable: {exc}", approved.pop(e.ip)[2])
                continue
            if others:
                why = f"the live blocks hold {len(others)} other IP(s) of the handle: {', '.join(others[:5])}"
        if why:
            for e in going:
                settle(e, Result.HELD_BY_HANDLE, why, approved.pop(e.ip)[2])


def _append(client: redis.Redis, keys: Keys, records: Sequence[AuditRecord]) -> None:
    """Append the records to the audit stream; one that cannot be written is logged (they are printed).
    Each is also an `ipamgc.audit` log line, as the leader's are."""
    log_records(records)
    pipe = client.pipeline(transaction=False)
    for r in records:
        flat = r.to_fields()
        pipe.xadd(
            keys.audit, dict(zip(flat[::2], flat[1::2], strict=True)), maxlen=AUDIT_MAXLEN, approximate=True
        )
    try:
        pipe.execute()
    except redis.RedisError as exc:
        log.error("audit records not written: %s", exc)
