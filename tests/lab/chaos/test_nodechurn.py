"""The `node-churn` fault (`lab.chaos.nodechurn`) and its judgement (`lab.chaos.nodes`): nodes of
the chaos cluster replaced, drained or lost, and every deleted node's IPs, blocks and affinities freed
within grace + settle of the heal, or the run fails naming the node and what it still holds.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from lab.apiserver.store import Store
from lab.chaos import FAULT_KINDS, ChaosOptions, ChaosReport, run_chaos, schedule
from lab.chaos.nodes import LOOK_ALIKE_NODES, NodeWatch
from lab.cluster.cluster import SimCluster
from lab.cluster.nodechurn import NodeChurn, NodeChurnPlan


def _report() -> ChaosReport:
    return ChaosReport(seed=0, options={}, log_dir="")


def test_a_deleted_node_still_holding_a_block_fails_the_run_naming_it() -> None:
    sim = SimCluster(Store(seed=1), seed=1)
    sim.add_node("kept")
    sim.add_node("gone")  # its tunnel IP claims it a block, affine to it, and a BlockAffinity
    watch = NodeWatch(sim)
    watch.deleting("gone", abrupt=False)
    sim.delete_node("gone")  # nobody frees what it held
    report = _report()
    watch.judge(report, healed=time.time())
    assert report.nodes_deleted == 1 and report.nodes_freed == 0
    [line] = report.nodes_not_freed
    assert (
        line.startswith("gone (drained") and "1 IPs" in line and "1 blocks" in line and "1 affinities" in line
    )
    assert not report.ok()
    assert any("gone" in p and "not freed" in p for p in report.problems())
    # Its block deleted (its IP with it), its affinity left: the run still fails, on the affinity alone.
    [block] = [b for b in sim.store.list("ipamblocks")["items"] if b["spec"]["affinity"] == "host:gone"]
    sim.store.delete("ipamblocks", None, block["metadata"]["name"])
    report = _report()
    watch.judge(report, healed=time.time())
    [line] = report.nodes_not_freed
    assert "1 affinities" in line and "blocks" not in line and "IPs" not in line
    # Everything gone: freed, and the node that was never deleted is not judged.
    [affinity] = [a for a in sim.store.list("blockaffinities")["items"] if a["spec"]["node"] == "gone"]
    sim.store.delete("blockaffinities", None, affinity["metadata"]["name"])
    report = _report()
    watch.judge(report, healed=time.time())
    assert report.ok() and report.nodes_deleted == report.nodes_freed == 1


def test_node_churn_is_opt_in_scheduled_last_and_ends_before_the_heal() -> None:
    assert "node-churn" not in FAULT_KINDS and "node-churn" not in {f.kind for f in schedule(ChaosOptions())}
    opts = ChaosOptions(seed=7, faults=(*FAULT_KINDS, "node-churn"))
    plan = schedule(opts)
    [churn] = [f for f in plan if f.kind == "node-churn"]
    assert churn.at + churn.length <= opts.duration
    assert churn.param("replaced") == 2 and churn.param("abrupt") == 0.5
    # Adding it moved no other fault of a seed: a replay without it is the same schedule.
    without = dataclasses.replace(opts, faults=FAULT_KINDS)
    assert [f for f in plan if f.kind != "node-churn"] == schedule(without)


def test_a_short_run_with_node_churn_frees_every_deleted_node(tmp_path: Path) -> None:
    """Seed 2: two nodes replaced, one drained, one terminated abruptly (~20 s)."""
    report = run_chaos(
        ChaosOptions(seed=2, duration=12.0, faults=("node-churn",), log_dir=tmp_path / "chaos")
    )
    timeline = "\n".join(report.timeline)
    assert report.ok(), "\n".join([*report.problems(), timeline])
    assert report.violations == [] and report.unexpected == [] and report.leaks_outstanding == []
    assert "1 drained, 1 abrupt, 2 Node objects deleted" in timeline, timeline
    assert report.nodes_deleted == report.nodes_freed == 2 and report.nodes_not_freed == []
    assert report.node_max_latency <= float(report.options["grace"]) + float(report.options["settle_seconds"])


def test_node_churn_driven_step_by_step_never_replaces_the_look_alikes_nodes() -> None:
    plan = NodeChurnPlan("t", 4, 2, 6, 0.06, 0.5, 16, 0.01, 0.02, 0.01, 1.0)
    sim = SimCluster(Store(seed=3), seed=3)
    sim.bulk_populate(plan.nodes, plan.pods_per_node)
    now = [0.0]  # a fake clock: each step's due time is reached by moving it
    churn = NodeChurn(sim, plan, seed=3, keep=LOOK_ALIKE_NODES, clock=lambda: now[0])
    churn.start(1.0)
    for _ in range(1000):
        delay = churn.step()
        if delay is None:
            break
        assert not churn.leaving & LOOK_ALIKE_NODES
        now[0] += delay
    assert delay is None and churn.stats.errors == 0 and len(churn.stats.deleted) == plan.replaced
    assert churn.stats.drained and churn.stats.abrupt
    assert sim.node_names >= LOOK_ALIKE_NODES and not churn.leaving


def test_a_node_freed_after_grace_and_settle_fails_the_run_too() -> None:
    sim = SimCluster(Store(seed=1), seed=1)
    sim.add_node("late")
    watch = NodeWatch(sim)
    watch.deleting("late", abrupt=True)
    sim.delete_node("late")
    for plural in ("ipamblocks", "blockaffinities"):  # a collector frees all of it …
        for obj in sim.store.list(plural)["items"]:
            sim.store.delete(plural, None, obj["metadata"]["name"])
    assert watch.poll()
    report = _report()
    watch.judge(report, healed=time.time() - 20.0, deadline=time.time() - 1.0)  # … after the deadline
    [line] = report.nodes_not_freed
    assert line.startswith("late (abrupt, deleted") and "s too late" in line and not report.ok()
