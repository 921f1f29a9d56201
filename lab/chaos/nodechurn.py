"""The `node-churn` fault: during its window nodes of the chaos cluster are replaced continuously, as a
cluster autoscaler replaces them (`lab.cluster.nodechurn`: a new node joins, the victim's pods are
rescheduled onto it, the victim is drained or terminated abruptly), beside the pod churn and the other
faults.  Every deleted node is watched (`lab.chaos.nodes`) until it holds nothing.

Scaled to the chaos cluster (`plan_for`): a third of its nodes (at least two) replaced over the window,
half of them abruptly, with an abrupt termination's delays compressed ×40 from the real ones (NotReady
40 s → 1 s, the Node object deleted 60 s → 1.5 s after the machine vanished, the pod GC 40 s → 1 s
later).  The pool stays the run's default one (`lab.cluster.cluster.DEFAULT_POOLS`, a /10): the other
faults need blocks to move, not a pool running out.
"""

from __future__ import annotations

import logging
import threading

from lab.chaos.hooks import ChurnDriver
from lab.chaos.nodes import LOOK_ALIKE_NODES
from lab.chaos.schedule import (
    NODE_CHURN_TAIL,
    NODE_DELETED_AFTER,
    NODE_NOT_READY_AFTER,
    NODE_POD_GC_AFTER,
    ChaosOptions,
)
from lab.chaos.state import RunState
from lab.cluster.nodechurn import NodeChurn, NodeChurnPlan

log = logging.getLogger(__name__)

DEFAULT_POOL_BLOCKS = 1 << 16  # the default IPv4 pool (a /10) in /26 blocks: only described, not made


def plan_for(opts: ChaosOptions, window: float, replaced: int, abrupt: float) -> NodeChurnPlan:
    """`replaced` nodes of the run's cluster over `window` seconds, an `abrupt` share of them lost."""
    return NodeChurnPlan(
        name="chaos",
        nodes=opts.nodes,
        pods_per_node=opts.pods_per_node,
        replaced=replaced,
        period=window,
        abrupt=abrupt,
        pool_blocks=DEFAULT_POOL_BLOCKS,
        not_ready_after=NODE_NOT_READY_AFTER,
        node_deleted_after=NODE_DELETED_AFTER,
        pod_gc_after=NODE_POD_GC_AFTER,
        compression=40.0,
        source="a third of the chaos cluster's nodes over the window, half abruptly (node lifecycle ÷ 40)",
    )


class NodeChurnDriver:
    """The node churn in a thread, each of its steps under the pod churn's lock (one change of the
    simulated cluster at a time).  After each step the pod churn is told the live nodes, so that it never
    schedules a pod onto a node that is leaving or gone."""

    def __init__(self, run: RunState, churn: ChurnDriver, plan: NodeChurnPlan) -> None:
        self.run = run
        self.churn = churn
        self.plan = plan
        self.node_churn = NodeChurn(
            run.sim, plan, seed=run.opts.seed, deleting=self._deleting, keep=LOOK_ALIKE_NODES
        )
        self._thread = threading.Thread(target=self._run, name="chaos-node-churn", daemon=True)

    def _deleting(self, node: str, abrupt: bool) -> None:
        self.run.node_watch.deleting(node, abrupt, NODE_POD_GC_AFTER if abrupt else 0.0)

    def _run(self) -> None:
        sim = self.run.sim
        with self.churn.lock:
            self.node_churn.start(1.0)
        while not self.run.stop.is_set():
            with self.churn.lock:
                delay = self.node_churn.step()
                live = sim.node_names - self.node_churn.leaving
                self.churn.churn._nodes = sorted(live or sim.node_names)
            if delay is None:
                return
            if delay > 0:
                self.run.stop.wait(delay)

    def start(self) -> None:
        self._thread.start()

    def finish(self) -> None:
        """Wait (supervising the components meanwhile) until every replacement and every abrupt node's
        delayed steps are done; the deleted nodes are then judged after the heal."""
        timeout = self.plan.period + NODE_CHURN_TAIL + 10.0
        done = self.run.wait_for(lambda: self.run.poll() or not self._thread.is_alive(), timeout, 0.1)
        stats = self.node_churn.stats
        self.run.note(
            "node-churn-end",
            f"{stats.joined} joined, {stats.drained} drained, {stats.abrupt} abrupt, {len(stats.deleted)} "
            f"Node objects deleted, {stats.pods_created} pods rescheduled, {stats.pods_gc} removed by the "
            f"pod GC, {stats.errors} errors" + ("" if done else "; NOT finished in time"),
        )
