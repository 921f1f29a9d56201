"""What the deleted nodes of a chaos run still hold, judged on the ground truth: every IP a node had when
its Node object went must be released, and no IPAMBlock may stay affine to it (`spec.affinity ==
"host:<node>"`) nor any BlockAffinity name it (`spec.node`), within grace + `settle_seconds` of the heal.

Why the heal and not the deletion: the run's other faults (Redis back empty, the watcher, the leaders
killed, the API failing) may stall every collection for seconds while they last, as they stall the leaks'
release, which is judged from the heal for the same reason.  How long each node took from its *due* time
is reported beside it: the deletion of a drained node's Node object, the pod GC of an abruptly
terminated node's pods (until then its pods exist, and Calico's rules, like ipamgc's, keep their IPs).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from lab.chaos.report import ChaosReport
from lab.cluster.cluster import SimCluster
from lab.cluster.nodechurn import affine_node, held_ips
from lab.cluster.truth import Usage

# Nodes that neither node churn nor the node-lost scenario deletes: a live pod whose allocation names
# node-00001 (#12257) keeps that node "in use", so Calico's rules rightly keep its tunnel IP (the truth
# would call it leaked); node-00000 holds the look-alike pods that must be kept whatever happens.
LOOK_ALIKE_NODES = frozenset({"node-00000", "node-00001"})


@dataclass
class DeletedNode:
    """A node whose Node object a run deleted, what it had then, and when it held nothing any more."""

    name: str
    abrupt: bool
    deleted_at: float  # wall time
    due: float  # when a collector may free all of it: the deletion, or an abrupt node's pod GC
    ips: list[Usage] = field(default_factory=list)  # the lifetimes of its IPs when it was deleted
    freed_at: float | None = None
    parts_freed_at: dict[str, float] = field(default_factory=dict)  # "IPs", "blocks", "affinities" → when


@dataclass(frozen=True, slots=True)
class Held:
    """What a deleted node still holds."""

    ips: tuple[str, ...] = ()
    blocks: tuple[str, ...] = ()
    affinities: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.ips or self.blocks or self.affinities)

    def parts(self) -> dict[str, tuple[str, ...]]:
        return {"IPs": self.ips, "blocks": self.blocks, "affinities": self.affinities}

    def __str__(self) -> str:
        parts = [
            f"{len(items)} {what} ({', '.join(items[:4])}{', …' if len(items) > 4 else ''})"
            for what, items in self.parts().items()
            if items
        ]
        return ", ".join(parts) or "nothing"


def held_by(sim: SimCluster, nodes: Iterable[DeletedNode]) -> dict[str, Held]:
    """What each of `nodes` still holds: its IPs not released (the ground truth), the blocks affine to it
    and its BlockAffinities (the store: one list of each)."""
    wanted = {n.name: n for n in nodes}
    names: dict[str, dict[str, list[str]]] = {"ipamblocks": {}, "blockaffinities": {}}
    for plural, by_node in names.items():
        for obj in sim.store.list(plural)["items"]:
            node = affine_node(plural, obj)
            if node in wanted:
                by_node.setdefault(node, []).append(str(obj["metadata"]["name"]))
    return {
        name: Held(
            tuple(sorted(u.ip for u in n.ips if u.freed_at is None)),
            tuple(sorted(names["ipamblocks"].get(name, []))),
            tuple(sorted(names["blockaffinities"].get(name, []))),
        )
        for name, n in wanted.items()
    }


class NodeWatch:
    """The deleted nodes of a run (`deleting`, called just before a Node object goes) and when each was
    freed (`poll`, called every few tenths of a second by whoever drives the run), then the judgement
    (`judge`, after the heal)."""

    def __init__(self, sim: SimCluster) -> None:
        self.sim = sim
        self.nodes: dict[str, DeletedNode] = {}
        self._lock = threading.Lock()
        self._polled = 0.0

    def deleting(self, node: str, abrupt: bool, due_after: float = 0.0) -> None:
        at = time.time()
        entry = DeletedNode(node, abrupt, at, at + due_after, held_ips(self.sim, [node])[node])
        with self._lock:
            self.nodes[node] = entry

    def pending(self) -> list[DeletedNode]:
        with self._lock:
            return [n for n in self.nodes.values() if n.freed_at is None]

    def poll(self, every: float = 0.0) -> bool:
        """Record which deleted nodes hold nothing any more (not again within `every` seconds of the last
        look); True when none holds anything."""
        pending = self.pending()
        if not pending:
            return True
        now = time.time()
        with self._lock:
            if now - self._polled < every:
                return False
            self._polled = now
        held = held_by(self.sim, pending)
        with self._lock:
            for n in pending:
                for part, items in held[n.name].parts().items():
                    if not items:
                        n.parts_freed_at.setdefault(part, now)
                if not held[n.name]:
                    n.freed_at = now
        return all(not held[n.name] for n in pending)

    def judge(self, report: ChaosReport, healed: float, deadline: float | None = None) -> None:
        """Into `report`: how many nodes were deleted and freed by `deadline` (wall time; default: now),
        the longest time from due to freed, and a line per node still holding anything then (it fails the
        run)."""
        self.poll()
        with self._lock:
            nodes = sorted(self.nodes.values(), key=lambda n: n.deleted_at)
        late = [n for n in nodes if n.freed_at is not None and deadline is not None and n.freed_at > deadline]
        pending = [n for n in nodes if n.freed_at is None]
        held = held_by(self.sim, pending) if pending else {}
        freed = [n for n in nodes if n.freed_at is not None and n not in late]
        report.nodes_deleted = len(nodes)
        report.nodes_freed = len(freed)
        report.node_max_latency = round(max((n.freed_at or 0.0) - n.due for n in freed) if freed else 0.0, 2)
        report.node_part_latency = {
            part: round(max(n.parts_freed_at[part] - n.due for n in freed), 2)
            for part in ("IPs", "blocks", "affinities")
            if freed
        }

        def line(n: DeletedNode) -> str:
            how = "abrupt" if n.abrupt else "drained"
            head = f"{n.name} ({how}, deleted {healed - n.deleted_at:.1f}s before the heal)"
            if n.freed_at is not None and deadline is not None:
                return f"{head} freed {n.freed_at - deadline:.1f}s too late"
            return f"{head} still holds {held[n.name]}"

        report.nodes_not_freed = [line(n) for n in sorted(pending + late, key=lambda n: n.deleted_at)]
