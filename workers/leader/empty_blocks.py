"""Empty blocks of live nodes (§3.10), at a cost that follows what changed, not the cluster's size.

Scanning and decoding every block record to find the empty ones cost the leader ~0.4-0.8 CPU s per pass
at 150,000 pods.  The watcher already diffs every block, so it keeps the index: `P:empty` holds every
`host:`-affine block whose in-use count is 0 (a handful normally), with its host and since when it has
been empty (`shared.records.EmptyBlock`).  A pass (`EmptyBlocks.run`) reads only those, in two pipelined
round trips: the index, the timers (and the records of the few blocks the backstop found, below); then
per host its affine-block count (SCARD of its `nodeblocks` set) and node record.  It decides with
`shared.rules.evaluate_empty_block`, as Calico does: never a node's last block, never during a
flannel migration, only after two observations more than the grace period apart — for a deleted node
whose pods are still there too (Calico's `releaseUnusedBlocks` does not ask whether the node exists).
A host's blocks are looked at with its keeper last (`shared.keeper`: the lowest-addressed), counted
without the host's other empty blocks still there, so an all-empty node keeps the block `check` names.

Timers (`P:emptyblocks`, Calico's `blockReleaseTracker`): `"<first> <since>"`, the leader's first
observation and the index entry's `since` it was started against.  A different `since` means the block
was used and emptied again (Calico's `markInUse` on every non-empty update, which a pass could miss
between two looks): the timer restarts.  It starts at the later of the leader's clock and `since`, so a
watcher clock ahead or behind the leader's only ever delays a release.  A timer started before the
grace period last changed (`P:state` `leak_grace_since`) counts from the change, as Calico's tracker
starts again when it restarts on a configuration change.  An entry that cannot be read is
logged, counted (`malformed`) and skipped, never released on; a timer whose block left the index is
cleared.

The backstop (`EmptyBlocks.backstop`, every `empty_block_backstop_seconds`, at a term's first pass and
after the mirror is rebuilt): the full scan the pass used to be, for what the index cannot show.  Host
blocks whose node record is gone with no `dirtyblocks` entry (Redis lost the delete) go to
`DeletedNodes.orphans`; an empty host block missing from `P:empty` is kept in `unindexed` and looked at
by every pass (its record re-read: a handful of HMGET fields) like an entry whose `since` is the
leader's own first observation — the same rules, so it never releases anything earlier than the index
would.  The release itself is `release_block_affinity` (live GET, the library's must-be-empty check,
CAS): the mirror only nominates.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from kubeio.errors import KubeError
from shared.blockrecords import BLOCK_SCAN_COUNT, decode_block, decode_block_head
from shared.codec import RecordError
from shared.errors import MalformedObject, TransientError
from shared.gcrecords import decode_empty
from shared.keeper import keeper_count, release_order
from shared.model import IPAMBlock
from shared.netaddr import AddressError, cidr_to_name, parse_network
from shared.records import decode_node
from shared.rules import evaluate_empty_block
from shared.shard import shard_of
from shared.verdicts import Release
from workers.leader.audit import AuditRecord, Result
from workers.leader.cleanup import (
    BlockNotEmpty,
    Context,
    DeletedNodes,
    decode_blocks,
    release_block_affinity,
    reply_bytes,
)

log = logging.getLogger("workers.empty_blocks")  # its pre-split name (#37): log lines unchanged


@dataclass(frozen=True, slots=True)
class Timer:
    """A first-empty observation: when (leader's clock, or `since` if later), and the index entry's
    `since` it was started against (None: a block the backstop found missing from the index)."""

    first: float
    since: float | None = None

    def encode(self) -> str:
        return repr(self.first) if self.since is None else f"{self.first!r} {self.since!r}"


def parse_timer(raw: bytes | None) -> Timer | None:
    """None when unreadable: the timer restarts (a later release, never an earlier one)."""
    if raw is None:
        return None
    try:
        parts = [float(p) for p in raw.split()]
    except ValueError:
        return None
    if len(parts) == 1:
        return Timer(parts[0])
    if len(parts) == 2:
        return Timer(parts[0], parts[1])
    return None


@dataclass(frozen=True, slots=True)
class Candidate:
    host: str
    since: float | None  # the index entry's; None: found by the backstop, not in the index


class _Timers:
    """`P:emptyblocks` (fenced writes), or process memory in a dry run (which must not leave state a real
    leader would act on)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._memory: dict[str, Timer] = {}

    def parse(self, stored: Any) -> dict[str, Timer | None]:
        """The HGETALL reply (ignored in a dry run)."""
        if self.ctx.dry_run:
            return dict(self._memory)
        items = stored.items() if isinstance(stored, dict) else ()
        return {k.decode(errors="replace"): parse_timer(reply_bytes(v)) for k, v in items}

    def set(self, cidr: str, timer: Timer) -> None:
        if self.ctx.dry_run:
            self._memory[cidr] = timer
        else:
            self.ctx.write("HSET", self.ctx.keys.emptyblocks, cidr, timer.encode())

    def clear(self, *cidrs: str) -> None:
        if not cidrs:
            return
        if self.ctx.dry_run:
            for c in cidrs:
                self._memory.pop(c, None)
        else:
            self.ctx.write("HDEL", self.ctx.keys.emptyblocks, *cidrs)


class EmptyBlocks:
    """Empty affine blocks of live nodes, from the watcher's index (see the module docstring)."""

    def __init__(self, ctx: Context, deleted: DeletedNodes) -> None:
        self.ctx = ctx
        self.deleted = deleted
        self.timers = _Timers(ctx)
        self.unindexed: dict[str, str] = {}  # CIDR → host: empty host blocks the backstop found unindexed
        self.malformed = 0  # index entries skipped as unreadable (one per entry per pass)
        self._malformed_seen: set[tuple[str, bytes]] = set()  # logged once each
        self._dry_reported: set[str] = set()

    # -- the backstop: every block record ----------------------------------------------------------

    def backstop(self) -> None:
        """The full scan (see the module docstring): orphaned hosts, and empty blocks the index lacks."""
        ctx = self.ctx
        blocks = decode_blocks(
            ctx.redis.hscan_iter(ctx.keys.blocks, count=BLOCK_SCAN_COUNT), decode_block_head
        )
        indexed = {_text(k) for k in ctx.redis.hkeys(ctx.keys.empty)}
        hosts = sorted({rec.host for rec in blocks.values() if rec is not None and rec.host is not None})
        found = ctx.redis.hmget(ctx.keys.nodes, hosts) if hosts else []
        self.deleted.orphans.update(h for h, raw in zip(hosts, found, strict=True) if raw is None)
        self.unindexed = {
            cidr: rec.host
            for cidr, rec in sorted(blocks.items())
            if rec is not None and rec.host is not None and rec.in_use == 0 and cidr not in indexed
        }
        if self.unindexed:
            log.info("backstop: %d empty host blocks missing from the empty-block index", len(self.unindexed))

    # -- the pass: the index only --------------------------------------------------------------------

    def _candidates(self) -> tuple[dict[str, Candidate], dict[str, Timer | None]]:
        """CIDR → candidate (index entries, then the backstop's unindexed blocks still empty); timers."""
        ctx = self.ctx
        unindexed = sorted(self.unindexed)
        pipe = ctx.redis.pipeline(transaction=False)
        pipe.hgetall(ctx.keys.empty)
        if not ctx.dry_run:
            pipe.hgetall(ctx.keys.emptyblocks)
        if unindexed:
            pipe.hmget(ctx.keys.blocks, unindexed)
        replies = pipe.execute()
        entries: dict[bytes, bytes] = replies[0]
        timers = self.timers.parse(replies[1] if not ctx.dry_run else None)
        out: dict[str, Candidate] = {}
        for key, data in sorted(entries.items()):
            cidr = key.decode(errors="replace")
            try:
                parse_network(cidr)
                entry = decode_empty(data)
            except (RecordError, AddressError) as exc:
                self.malformed += 1
                if (cidr, data) not in self._malformed_seen:
                    self._malformed_seen.add((cidr, data))
                    log.warning("unreadable empty-block entry skipped: %s", exc, extra={"block": cidr})
                continue
            out[cidr] = Candidate(entry.host, entry.since)
        indexed = {k.decode(errors="replace") for k in entries}
        if unindexed:
            raw = [reply_bytes(v) for v in replies[-1]]
            records = decode_blocks(zip((c.encode() for c in unindexed), raw, strict=True), decode_block)
            for cidr in unindexed:
                rec, host = records.get(cidr), self.unindexed[cidr]
                if cidr in indexed or rec is None or rec.host != host or rec.in_use != 0:
                    del self.unindexed[cidr]  # indexed now (the index owns it), gone, moved or in use
                else:
                    out[cidr] = Candidate(host, None)
        return out, timers

    def run(self, now: float, grace: float | None, grace_since: float = 0.0) -> None:
        """One pass.  `grace_since`: when the grace period last changed; a timer started before it
        counts from it (Calico's `blockReleaseTracker` starts again when it restarts on that change)."""
        ctx = self.ctx
        candidates, timers = self._candidates()
        self.timers.clear(*sorted(c for c in timers if c not in candidates))  # not empty now: reset
        hosts = sorted({c.host for c in candidates.values()})
        if not hosts:
            return
        pipe = ctx.redis.pipeline(transaction=False)
        for host in hosts:
            pipe.scard(ctx.keys.nodeblocks(shard_of(host, ctx.shards), host))
        pipe.hmget(ctx.keys.nodes, hosts)
        replies = pipe.execute()
        per_node: dict[str, int] = {h: int(n) for h, n in zip(hosts, replies[:-1], strict=True)}
        records = {h: reply_bytes(raw) for h, raw in zip(hosts, replies[-1], strict=True)}
        # Host blocks that outlived their node (its delete was missed): the deleted-node cleanup owns them.
        self.deleted.orphans.update(h for h, raw in records.items() if raw is None)
        by_host: dict[str, list[str]] = {}
        for cidr, cand in candidates.items():
            by_host.setdefault(cand.host, []).append(cidr)
        for host in hosts:
            raw = records.get(host)
            # A gone node's empty blocks are judged like a live node's (Calico does not ask whether the
            # node exists here): all but its last go after the grace period, while its valid allocations
            # keep the node itself from being cleaned up.
            labels: dict[str, str] = {}
            if raw is not None:
                try:
                    labels = dict(decode_node(host, raw).labels)
                except RecordError as exc:
                    log.warning("unreadable node record, blocks kept: %s", exc, extra={"node": host})
                    continue
            order = release_order(by_host[host])
            keep = order[-1]
            released: set[str] = set()
            for cidr in order:
                count = per_node[host]
                if cidr == keep:  # the keeper last, counted without the node's other empty blocks left
                    count = keeper_count(count, len(order) - 1 - len(released))
                if self._look(cidr, candidates[cidr], labels, count, timers, grace, now, grace_since):
                    released.add(cidr)
                    per_node[host] -= 1  # Calico's forgetBlock: the node's count drops before its next block

    def _look(
        self,
        cidr: str,
        cand: Candidate,
        labels: dict[str, str],
        affine_blocks: int,
        timers: dict[str, Timer | None],
        grace: float | None,
        now: float,
        grace_since: float = 0.0,
    ) -> bool:
        """Judge one empty block (timer kept, restarted or cleared); True when it was released."""
        host = cand.host
        timer = timers.get(cidr)
        # A timer started against another `since` is of an earlier emptiness: restart it.
        first = timer.first if timer is not None and timer.since == cand.since else None
        if first is not None and first < grace_since:
            first = grace_since  # started before the grace period changed: counts from the change
        verdict = evaluate_empty_block(
            _stand_in(cidr, host), True, False, labels, affine_blocks, grace, first, now
        )
        if verdict is None:
            return False
        if verdict.first_empty is None:
            if cidr in timers:
                self.timers.clear(cidr)
            return False
        if first is None:
            start = verdict.first_empty if cand.since is None else max(verdict.first_empty, cand.since)
            self.timers.set(cidr, Timer(start, cand.since))
        if verdict.release is not Release.NOW:
            return False
        evidence = {"first_empty": verdict.first_empty, "affine_blocks": affine_blocks, "grace": grace}
        if cand.since is not None:
            evidence["since"] = cand.since
        return self._release(cidr, host, evidence, now)

    def _release(self, cidr: str, host: str, evidence: dict[str, Any], now: float) -> bool:
        ctx = self.ctx
        if ctx.dry_run:
            if cidr not in self._dry_reported:
                self._dry_reported.add(cidr)
                reason = "would release the empty block"
                ctx.record(_empty_record(Result.DRY_RUN, host, cidr, reason, evidence))
            return False
        try:
            # Calico's `ReleaseBlockAffinity` reads the IPAM config for each call.
            cooldown = ctx.ip_cooldown() if ctx.ip_cooldown is not None else None
            done = release_block_affinity(ctx.api, host, cidr, ctx.guard, cooldown=cooldown, now=now)
        except BlockNotEmpty as exc:
            self.timers.clear(cidr)  # in use after all: the timer restarts
            log.info("empty block in use after all: %s", exc, extra={"node": host, "block": cidr})
            return False
        except (KubeError, MalformedObject, TransientError) as exc:
            log.warning("empty block not released: %s", exc, extra={"node": host, "block": cidr})
            return False
        self.timers.clear(cidr)
        self.unindexed.pop(cidr, None)
        ctx.record(_empty_record(Result.RELEASED, host, cidr, str(done), evidence))
        return True


def _empty_record(result: Result, node: str, cidr: str, reason: str, evidence: dict[str, Any]) -> AuditRecord:
    return AuditRecord(
        result=result, block=cidr, node=node, rule="empty-block", reason=reason, evidence=evidence
    )


def _text(key: bytes | str) -> str:
    return key.decode(errors="replace") if isinstance(key, bytes) else key


def _stand_in(cidr: str, host: str) -> IPAMBlock:
    """An empty `host:` block as the rule reads it (the mirror keeps counts, not the block itself)."""
    return IPAMBlock(
        name=cidr_to_name(cidr),
        cidr=parse_network(cidr),
        affinity=f"host:{host}",
        allocations=(None,),
        unallocated=(),
        attributes=(),
        sequence_number=0,
        sequence_number_for_allocation={},
    )
