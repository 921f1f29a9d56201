"""Validate taken batches: the shard job's judging half, from the leased ids to the batch's writes.

Its own module because it is independent of how a job is driven: a draining job (`workers.shards.validate`)
hands it one batch at a time, a lingering one (`workers.shards.linger`) the batches of every shard it holds at
once, and both get the same three shared round trips — every batch's records, the nodes and pods they
name, every batch's writes and acks (built in `workers.shards.writes`).  In between: group by node, a gone
node's other allocations, KubeVirt's VMs once mirrored, and `shared.rules.evaluate_node`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Protocol

from redisio import luapipe
from redisio.heldconn import run
from redisio.shardqueue.queue import Lease
from shared.keys import pod_key
from shared.kubevirt import vm_key_of
from shared.model import ATTR_NAMESPACE, ATTR_POD, Allocation, AllocationID
from shared.rules import evaluate_node
from shared.verdicts import AllocationType, KubeVirtView, LeakState, Lookup, PodView, Reason, Verdict
from workers.common.redis_state import Entry, GlobalState, World
from workers.shards.writes import WritesCounts, WritesJob, _Writes

log = logging.getLogger("workers.batches")  # its pre-split name (#37): log lines unchanged


class _BatchStats(WritesCounts, Protocol):
    """The shard job's counters a batch adds to (`workers.shards.validate.ShardStats`), beyond its writes'."""

    batches: int
    skipped_malformed: int
    vanished: int
    unknown_lookups: int


class _BatchJob(WritesJob, Protocol):
    """The shard job (`workers.shards.validate._ShardJob`) as its batches see it (its writes' view, and the
    log context); an interface, so that this module does not import the one that imports it."""

    extra: dict[str, int]

    @property
    def stats(self) -> _BatchStats: ...


def validate_batches(
    batches: Sequence[tuple[_BatchJob, Lease]], state: GlobalState, now: float
) -> list[float | None]:
    """Validate taken batches of one or more shards; returns each one's earliest due time written.

    The round trips are shared: one for every batch's records, one for the nodes and pods they all name
    (global hashes), one for every batch's writes and acks.  A lingering job holding several shards
    (workers/shards/linger.py) so pays three round trips a look, not three per shard.  Rare reads stay per
    batch: a gone node's other allocations, blocks' resourceVersions for confirmed leaks."""
    if not batches:
        return []
    first = batches[0][0]
    started = first.monotonic()
    pipe = first.redis.pipeline(transaction=False)
    spans = [job.reader.queue_entries(pipe, lease.ids) for job, lease in batches]
    replies = run(pipe, first.held) if len(pipe) else []
    sorted_batches: list[tuple[dict[str, Entry], dict[str, dict[str, Allocation]], set[str]]] = []
    at = 0
    for (job, lease), span in zip(batches, spans, strict=True):
        job.stats.batches += 1
        entries = job.reader.parse_entries(lease.ids, replies[at : at + span])
        at += span
        sorted_batches.append((entries, *_sort(job, lease, entries)))
    every = [a for _, by_node, _ in sorted_batches for m in by_node.values() for a in m.values()]
    world = first.reader.world((n for _, by_node, _ in sorted_batches for n in by_node), _pod_keys(every))
    first.stats.unknown_lookups += world.malformed
    helds = [
        _load_gone_nodes(job, by_node, entries, world)
        for (job, _), (entries, by_node, _) in zip(batches, sorted_batches, strict=True)
    ]
    kubevirt = None  # KubeVirt not installed, or its VMs not mirrored yet: every VM allocation valid
    if state.kubevirt:
        vm_keys = [
            key
            for _, by_node, _ in sorted_batches
            for m in by_node.values()
            for a in m.values()
            if (key := vm_key_of(a))
        ]
        kubevirt, bad = first.reader.kubevirt(vm_keys)
        first.stats.unknown_lookups += bad
    pipe = first.redis.pipeline(transaction=False)
    dues: list[float | None] = []
    for (job, lease), (entries, by_node, clear), held in zip(batches, sorted_batches, helds, strict=True):
        writes = _Writes(job, state.grace, now)
        writes.clear |= clear
        _judge(by_node, entries, world, held, kubevirt, writes, state.grace, now, state.grace_since)
        writes.queue(pipe, lease, started)
        dues.append(min(writes.due.values(), default=None))
    luapipe.execute(pipe, first.redis, first.queue.pipelined_scripts, first.held)
    return dues


def _sort(
    job: _BatchJob, lease: Lease, entries: dict[str, Entry]
) -> tuple[dict[str, dict[str, Allocation]], set[str]]:
    """A batch's allocations by node, and the ids that are done with (vanished, no node)."""
    by_node: dict[str, dict[str, Allocation]] = {}
    clear: set[str] = set()
    for alloc_id in lease.ids:
        e = entries[alloc_id]
        if e.error is not None:
            job.stats.skipped_malformed += 1
            log.warning(
                "skipping unreadable allocation record: %s",
                e.error,
                extra={**job.extra, "alloc": alloc_id},
            )
        elif e.alloc is None:
            job.stats.vanished += 1
            clear.add(alloc_id)
        elif not e.alloc.node:  # never GC'd; not expected in a shard
            clear.add(alloc_id)
        else:
            by_node.setdefault(e.alloc.node, {})[alloc_id] = e.alloc
    return by_node, clear


def _judge(
    by_node: dict[str, dict[str, Allocation]],
    entries: dict[str, Entry],
    world: World,
    held: set[str],
    kubevirt: KubeVirtView | None,
    writes: _Writes,
    grace: float | None,
    now: float,
    grace_since: float = 0.0,
) -> None:
    """The rules on every node of the batch, their verdicts recorded in `writes`.  A candidate timer
    started before the grace period last changed (`grace_since`) counts from the change, as Calico's
    timers start again when it restarts on that change (`writes` stores the restarted timer)."""

    def pods(ns: str, name: str) -> PodView:
        return world.pods.get(pod_key(ns, name), Lookup.UNKNOWN)

    for node, allocs in sorted(by_node.items()):
        exists = world.node_exists.get(node, True)
        timers = {
            AllocationID(i): max(c.first_seen, grace_since)
            for i in allocs
            if (c := entries[i].candidate) is not None and c.sequence_number == allocs[i].sequence_number
        }
        verdict = evaluate_node(node, exists, allocs.values(), pods, timers, grace, now, kubevirt)
        for v in verdict.verdicts:
            kept = _hold_tunnel(v) if node in held else v
            writes.record(kept, entries[v.allocation.id], exists, world)


def _load_gone_nodes(
    job: _BatchJob, by_node: dict[str, dict[str, Allocation]], entries: dict[str, Entry], world: World
) -> set[str]:
    """Add every allocation of each gone node; returns the nodes with an unreadable one (held)."""
    gone = sorted(n for n in by_node if not world.node_exists.get(n, True))
    if not gone:
        return set()
    members = job.reader.node_members(gone)
    entries.update(job.reader.entries([i for n in gone for i in members[n] if i not in entries]))
    held: set[str] = set()
    added: list[Allocation] = []
    for node in gone:
        for alloc_id in members[node]:
            e = entries[alloc_id]
            if e.error is not None:
                held.add(node)  # we cannot know it is not in use: keep the node's tunnel IPs
            elif e.alloc is not None and e.alloc.node == node and alloc_id not in by_node[node]:
                by_node[node][alloc_id] = e.alloc
                added.append(e.alloc)
    missing = [p for p in _pod_keys(added) if p not in world.pods]
    if missing:
        more = job.reader.world([], missing)
        world.pods.update(more.pods)
        job.stats.unknown_lookups += more.malformed
    return held


def _hold_tunnel(v: Verdict) -> Verdict:
    """A gone node with an unreadable allocation record is never known to be drained."""
    if v.type is AllocationType.TUNNEL and v.state is LeakState.CONFIRMED:
        return Verdict(v.allocation, v.type, False, Reason.NODE_IN_USE, LeakState.IGNORED, None)
    return v


def _pod_keys(allocs: Iterable[Allocation]) -> list[str]:
    out = []
    for a in allocs:
        ns, name = a.attrs.get(ATTR_NAMESPACE, ""), a.attrs.get(ATTR_POD, "")
        if ns and name:
            out.append(pod_key(ns, name))
    return out
