"""Node churn for the simulated cluster: nodes join and leave continuously, as a cluster autoscaler makes
them (Karpenter's consolidation and expiry, a spot fleet), so that a collector's cleanup of deleted nodes
can be measured where Calico's users say it stalls (projectcalico/calico#7839, #8643, #13404).

Each period, `replaced` of the cluster's nodes are replaced, one at a time at even intervals.  A
replacement is:
1. a new node joins (its Node object, then calico-node's tunnel address, which claims it a block);
2. the victim's pods are rescheduled onto it (a ReplicaSet's new pods: created, CNI ADD, status);
3. the victim leaves, one of two ways (`abrupt` is the share of the second):
   - **drained**: its pods are evicted (DELETE, the kubelet's CNI DEL, the confirmation), then its Node
     object is deleted.  What is left for a collector: its tunnel IP, its blocks and their affinities;
   - **terminated abruptly** (the machine vanishes): no CNI DEL ever runs.  After `not_ready_after` the
     node lifecycle controller marks it NotReady and its pods are evicted (they stay Terminating: no
     kubelet confirms); after `node_deleted_after` its Node object is deleted; `pod_gc_after` later the
     pod GC removes its pods.  Left for a collector: every IP it had, its blocks, their affinities.
The pool is as small as the caller makes it (`SimCluster(pools=…)`): a new node that finds no free block
borrows IPs from other nodes' blocks, as Calico's IPAM does, and an assignment that finds no free IP at all
is refused (`CalicoCNI.borrowed`, `CalicoCNI.refused`).

The times are compressed: `PRESETS` say from what, by what factor, and what that changes.  Seeded: a run is
the same replacement for replacement (which node, drained or not), whichever collector runs beside it.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import logging
import math
import random
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from lab.apiserver.store import SimApiError
from lab.cluster.cluster import SimCluster
from lab.cluster.cni import PoolExhausted
from lab.cluster.truth import Usage

log = logging.getLogger(__name__)

BLOCK_PREFIX = 26  # Calico's default IPv4 block size: 64 addresses


@dataclass(frozen=True, slots=True)
class NodeChurnPlan:
    """One node-churn setting (all times in the run's compressed seconds)."""

    name: str
    nodes: int  # the cluster's size, kept: one node joins for each that leaves
    pods_per_node: int
    replaced: int  # nodes replaced per period
    period: float
    abrupt: float  # the share of replacements that terminate the node abruptly
    pool_blocks: int  # /26 blocks in the IPv4 pool (a power of two: a pool is a CIDR)
    not_ready_after: float  # an abrupt node: its Ready condition Unknown, its pods evicted
    node_deleted_after: float  # an abrupt node: its Node object deleted (the cloud's node controller)
    pod_gc_after: float  # after the Node object went: the pod GC removes its pods
    compression: float  # real seconds per run second
    source: str = ""

    def __post_init__(self) -> None:
        if self.nodes < 2 or self.pods_per_node < 0 or self.replaced < 1 or not self.period > 0:
            raise ValueError("a node churn needs ≥ 2 nodes, ≥ 1 replaced per period and a positive period")
        if not 0.0 <= self.abrupt <= 1.0:
            raise ValueError("abrupt must be within 0..1")
        if self.pool_blocks < 1 or self.pool_blocks & (self.pool_blocks - 1):
            raise ValueError(f"pool_blocks must be a power of two (a pool is a CIDR), got {self.pool_blocks}")
        if self.pool_blocks < self.nodes:
            raise ValueError(
                f"a pool of {self.pool_blocks} blocks cannot hold {self.nodes} nodes' first blocks"
            )

    def pools(self) -> list[tuple[str, int]]:
        """The IPv4 pool of `pool_blocks` /26 blocks (10.64.0.0/…), as `SimCluster(pools=…)` takes it."""
        prefix = BLOCK_PREFIX - (self.pool_blocks.bit_length() - 1)
        return [(f"10.64.0.0/{prefix}", BLOCK_PREFIX)]

    def scaled(self, nodes: int, pods_per_node: int) -> NodeChurnPlan:
        """The same churn on a cluster of another size: the same share of nodes replaced per period, a
        pool as much larger than the cluster (rounded up to a power of two)."""
        if (nodes, pods_per_node) == (self.nodes, self.pods_per_node):
            return self
        blocks = 1 << max(0, math.ceil(nodes * self.pool_blocks / self.nodes) - 1).bit_length()
        return dataclasses.replace(
            self,
            nodes=nodes,
            pods_per_node=pods_per_node,
            replaced=max(1, round(self.replaced * nodes / self.nodes)),
            pool_blocks=blocks,
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# #7839 (Karpenter, ~250 nodes, more than 100 cycling every 15–20 minutes): 100 of 250 nodes every 15
# minutes, compressed ×10 (every 90 s).  The delays of an abrupt termination, real → compressed: NotReady
# 40 s (kube-controller-manager's node-monitor-grace-period) → 4 s; the Node object deleted 60 s after the
# machine vanished (the cloud node lifecycle controller, or Karpenter's own termination) → 6 s; the pod GC
# of orphaned pods 40 s later (its quarantine of an orphan, checked every 20 s) → 4 s.  The pool: 512 /26
# blocks for 250 nodes, so ~2.6 periods of leaked blocks exhaust it.
# Harder: 400 nodes, half of them every 10 minutes, 80 % abruptly, 512 blocks: a bit more than one period
# of leaked blocks exhausts the pool, and the replacements come every 0.3 s.
PRESETS: dict[str, NodeChurnPlan] = {
    "7839": NodeChurnPlan(
        name="7839",
        nodes=250,
        pods_per_node=30,
        replaced=100,
        period=90.0,
        abrupt=0.5,
        pool_blocks=512,
        not_ready_after=4.0,
        node_deleted_after=6.0,
        pod_gc_after=4.0,
        compression=10.0,
        source="projectcalico/calico#7839: ~250 nodes, 100+ cycling every 15–20 minutes (Karpenter)",
    ),
    "hard": NodeChurnPlan(
        name="hard",
        nodes=400,
        pods_per_node=25,
        replaced=200,
        period=60.0,
        abrupt=0.8,
        pool_blocks=512,
        not_ready_after=4.0,
        node_deleted_after=6.0,
        pod_gc_after=4.0,
        compression=10.0,
        source="harder than #7839: half of 400 nodes every 10 minutes, 80 % terminated abruptly",
    ),
}


@dataclass
class NodeChurnStats:
    joined: int = 0
    drained: int = 0
    abrupt: int = 0
    pods_created: int = 0
    pods_evicted: int = 0  # drained: deleted cleanly (CNI DEL); abrupt: marked Terminating, never confirmed
    pods_gc: int = 0  # removed by the pod GC (no CNI DEL)
    pods_refused: int = 0  # CNI ADD refused: the pool had no free address left
    tunnels_refused: int = 0
    errors: int = 0
    deleted: list[str] = field(default_factory=list)  # the Node objects deleted, in order

    @property
    def pod_events(self) -> int:
        return self.pods_created + self.pods_evicted + self.pods_gc

    def as_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "deleted"}
        out["nodes_deleted"] = len(self.deleted)
        out["pod_events"] = self.pod_events
        return out


class NodeChurn:
    """Replaces nodes of `sim` as `plan` says.  `deleting(node, abrupt)` is called just before each Node
    object is deleted (a measurement takes the node's IPs then); `run` returns once every replacement and
    every delayed step of an abrupt one (the pod GC) is done.  The nodes in `keep` are never replaced.
    A caller that interleaves the churn with other changes of the cluster (a chaos run's pod churn)
    calls `start`, then `step` under its own lock, instead of `run`."""

    def __init__(
        self,
        sim: SimCluster,
        plan: NodeChurnPlan,
        seed: int = 0,
        deleting: Callable[[str, bool], None] = lambda _node, _abrupt: None,
        clock: Callable[[], float] = time.monotonic,
        keep: Collection[str] = (),
    ) -> None:
        self.sim = sim
        self.keep = frozenset(keep)
        self.plan = plan
        self.rng = random.Random(seed)
        self.deleting = deleting
        self.clock = clock
        self.stats = NodeChurnStats()
        self._leaving: set[str] = set()  # victims not yet deleted: never picked twice, never scheduled on
        self._serial = itertools.count()
        self._queue: list[tuple[float, int, Callable[[], None]]] = []

    # -- the run ---------------------------------------------------------------------------------------------

    def run(self, periods: float, stop: threading.Event | None = None) -> NodeChurnStats:
        """`periods` periods of replacements, then the abrupt ones' delayed steps."""
        self.start(periods)
        while not (stop is not None and stop.is_set()):
            delay = self.step()
            if delay is None:
                break
            if delay > 0:
                if stop is not None:
                    stop.wait(delay)
                else:
                    time.sleep(delay)
        return self.stats

    def start(self, periods: float) -> None:
        """Queue `periods` periods of replacements from now, at even intervals."""
        plan = self.plan
        start = self.clock()
        interval = plan.period / plan.replaced
        for i in range(round(plan.replaced * periods)):
            self._at(start + i * interval, self._replace)

    def step(self) -> float | None:
        """Run the next step if it is due: 0.0 once run, else the seconds until it is due; None when
        nothing is left (every replacement and every delayed step of an abrupt one done)."""
        if not self._queue:
            return None
        due, _, action = self._queue[0]
        delay = due - self.clock()
        if delay > 0:
            return delay
        heapq.heappop(self._queue)
        try:
            action()
        except Exception:  # a load generator keeps going; the error is logged and counted
            self.stats.errors += 1
            log.exception("node churn step failed")
        return 0.0

    @property
    def leaving(self) -> frozenset[str]:
        """The nodes picked to leave whose Node object is not deleted yet."""
        return frozenset(self._leaving)

    def _at(self, due: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._queue, (due, next(self._serial), action))

    # -- one replacement -------------------------------------------------------------------------------------

    def _replace(self) -> None:
        sim = self.sim
        new = self._join()
        candidates = sorted(n for n in sim.node_names - self.keep if n != new and n not in self._leaving)
        if not candidates:
            return
        victim = self.rng.choice(candidates)
        abrupt = self.rng.random() < self.plan.abrupt
        self._leaving.add(victim)
        pods = sorted(k for k, n in sim.pod_nodes.items() if n == victim)
        for _ in pods:  # their replacements, on the new node
            self._create_pod(new)
        if not abrupt:
            self.stats.drained += 1
            for ns, pod in pods:
                sim.delete_pod(ns, pod)
                self.stats.pods_evicted += 1
            self._delete_node(victim, abrupt=False)
            return
        self.stats.abrupt += 1
        now = self.clock()
        plan = self.plan
        self._at(now + plan.not_ready_after, lambda: self._lost(victim))
        self._at(now + plan.node_deleted_after, lambda: self._delete_node(victim, abrupt=True))
        self._at(now + plan.node_deleted_after + plan.pod_gc_after, lambda: self._pod_gc(victim))

    def _join(self) -> str:
        sim = self.sim
        name = f"nc-{sim.churn_serial + 1:07d}"
        sim.churn_serial += 1
        try:
            sim.add_node(name)
        except PoolExhausted:  # its Node object is there; calico-node found no address for its tunnel
            self.stats.tunnels_refused += 1
        self.stats.joined += 1
        return name

    def _create_pod(self, node: str) -> None:
        sim = self.sim
        sim.churn_serial += 1
        serial = sim.churn_serial
        try:
            sim.create_pod(f"ns-{serial % 10}", f"nc-pod-{serial:07d}", node)
        except PoolExhausted:  # the pod stays ContainerCreating, as with a real CNI that cannot assign
            self.stats.pods_refused += 1
        self.stats.pods_created += 1

    def _lost(self, node: str) -> None:
        """The node lifecycle controller: NotReady, then its pods evicted (Terminating for ever: no kubelet
        answers)."""
        sim = self.sim
        sim.set_node_ready(node, False)
        for ns, pod in sorted(k for k, n in sim.pod_nodes.items() if n == node):
            try:
                sim.store.delete("pods", ns, pod)
            except SimApiError as exc:
                if exc.code != 404:
                    raise
            self.stats.pods_evicted += 1

    def _delete_node(self, node: str, abrupt: bool) -> None:
        self.deleting(node, abrupt)
        self.sim.delete_node(node)
        self._leaving.discard(node)
        self.stats.deleted.append(node)

    def _pod_gc(self, node: str) -> None:
        self.stats.pods_gc += len(self.sim.remove_pods_of_node(node))


# -- what a node holds (the benchmark's and chaos's measures of a deleted node read these) ----------------


def affine_node(plural: str, obj: Mapping[str, Any] | None) -> str | None:
    """The node an IPAMBlock (`spec.affinity: host:<node>`) or a BlockAffinity (`spec.node`) belongs to."""
    if obj is None:
        return None
    spec = obj.get("spec") or {}
    if plural == "blockaffinities":
        return str(spec.get("node") or "") or None
    affinity = str(spec.get("affinity") or "")
    return affinity[len("host:") :] if affinity.startswith("host:") else None


def held_ips(sim: SimCluster, nodes: Iterable[str]) -> dict[str, list[Usage]]:
    """The live IP lifetimes of each node (its tunnel's, its reserved ordinals', its pods'), as the ground
    truth has them: taken before the node is deleted."""
    nodes = list(nodes)
    owners = {f"{kind}:{n}": n for n in nodes for kind in ("tunnel", "reserved")}
    owners.update({f"{ns}/{pod}": n for (ns, pod), n in list(sim.pod_nodes.items()) if n in nodes})
    out: dict[str, list[Usage]] = {n: [] for n in nodes}
    with sim.truth._lock:
        for lives in sim.truth.usages.values():
            life = lives[-1]
            if life.freed_at is None and life.in_use_until is None and life.owner in owners:
                out[owners[life.owner]].append(life)
    return out
