"""Node churn (`lab.cluster.nodechurn`): nodes come and go as an autoscaler makes them, the pods move with
them, and what a deleted node leaves behind is exactly what Calico's rules call releasable."""

from __future__ import annotations

import dataclasses

import pytest

from lab.apiserver.store import Store
from lab.cluster.cluster import SimCluster
from lab.cluster.nodechurn import PRESETS, NodeChurn, NodeChurnPlan
from shared.audit import audit
from shared.consistency import check_consistency
from shared.netaddr import cidr_to_name
from shared.snapshot import build_inventory
from shared.verdicts import Release

PLAN = NodeChurnPlan(
    name="test",
    nodes=6,
    pods_per_node=4,
    replaced=4,
    period=0.2,
    abrupt=0.5,
    pool_blocks=16,
    not_ready_after=0.02,
    node_deleted_after=0.04,
    pod_gc_after=0.04,
    compression=1.0,
)


def _cluster(plan: NodeChurnPlan, seed: int = 1) -> SimCluster:
    sim = SimCluster(Store(seed=seed), seed=seed, pools=plan.pools())
    sim.bulk_populate(plan.nodes, plan.pods_per_node)
    return sim


def _releasable(sim: SimCluster) -> set[str]:
    report = audit(build_inventory(sim.export()["items"]), 900.0)
    return {r.verdict.allocation.ip for r in report.rows if r.release is Release.NOW}


def test_nodes_are_replaced_and_what_they_leave_is_what_the_rules_release() -> None:
    sim = _cluster(PLAN)
    pods = sim.pod_count()
    deleted: list[tuple[str, bool]] = []
    stats = NodeChurn(sim, PLAN, seed=2, deleting=lambda node, abrupt: deleted.append((node, abrupt))).run(1)
    assert stats.errors == 0
    assert stats.joined == stats.drained + stats.abrupt == len(deleted) == PLAN.replaced
    assert 0 < stats.abrupt < PLAN.replaced  # the seed gives both kinds
    assert len(sim.node_names) == PLAN.nodes  # one joined for each that left
    assert sim.pod_count() == pods  # every pod rescheduled, every abrupt node's pods removed by the pod GC
    assert not {n for n, _ in deleted} & sim.node_names
    assert stats.pods_gc == PLAN.pods_per_node * stats.abrupt  # every node holds as many pods
    # Left behind: an abrupt node's every IP, a drained node's tunnel IP only (its pods had CNI DEL); and
    # nothing else: the rules release exactly those, the ground truth agrees, nobody released in use.
    assert _releasable(sim) == sim.truth.leaked_ips()
    assert len(sim.truth.leaked_ips()) == stats.drained + stats.abrupt * (1 + PLAN.pods_per_node)
    assert sim.truth.violations == []
    assert check_consistency(build_inventory(sim.export()["items"])) == []
    # Their blocks and affinities stay until a collector frees them.
    affine = {a["spec"]["node"] for a in sim.store.list("blockaffinities")["items"]}
    assert {n for n, _ in deleted} <= affine


def test_the_same_seed_replaces_the_same_nodes_the_same_way() -> None:
    def run() -> list[tuple[str, bool]]:
        sim = _cluster(PLAN)
        out: list[tuple[str, bool]] = []
        NodeChurn(sim, PLAN, seed=5, deleting=lambda node, abrupt: out.append((node, abrupt))).run(1)
        return out

    assert run() == run()


def test_an_abrupt_node_s_pods_stay_terminating_until_the_pod_gc() -> None:
    plan = dataclasses.replace(PLAN, replaced=1, abrupt=1.0, pod_gc_after=30.0)
    sim = _cluster(plan)
    churn = NodeChurn(sim, plan, seed=2)
    churn._replace()  # the replacement alone; its delayed steps by hand, in order
    (victim,) = churn._leaving
    due = sorted(churn._queue)
    due[0][2]()  # NotReady, pods evicted: Terminating, no kubelet to confirm
    pods = [p for p in sim.store.list("pods", copy=False)["items"] if p["spec"]["nodeName"] == victim]
    assert len(pods) == plan.pods_per_node
    assert all(p["metadata"].get("deletionTimestamp") for p in pods)
    due[1][2]()  # the Node object deleted
    assert victim not in sim.node_names
    # Its pods still exist (Terminating): their IPs are in use by the rules, and so, while they are, its
    # tunnel IP (Calico releases a deleted node's tunnel only when nothing valid is left on it).
    assert _releasable(sim) == set()
    assert _tunnel_ips(sim, victim) <= sim.truth.leaked_ips()
    due[2][2]()  # the pod GC: the pods go, without CNI DEL
    left = [p for p in sim.store.list("pods", copy=False)["items"] if p["spec"]["nodeName"] == victim]
    assert left == []
    assert _releasable(sim) == sim.truth.leaked_ips()


def _tunnel_ips(sim: SimCluster, node: str) -> set[str]:
    with sim.truth._lock:
        return {lives[-1].ip for lives in sim.truth.usages.values() if lives[-1].owner == f"tunnel:{node}"}


def test_a_pool_that_runs_out_borrows_then_refuses_and_a_freed_block_is_claimed_again() -> None:
    # 4 nodes in a pool of 4 blocks: a new node finds no free block and borrows from the others' blocks.
    plan = dataclasses.replace(PLAN, nodes=4, pods_per_node=30, pool_blocks=4, replaced=1, abrupt=0.0)
    # Borrowing goes in address order (node-00000's block first), so with seed 2, which drains node-00000,
    # the drained node's block keeps the new node's borrowed IPs: no collector may free it (#8643).
    sim = _cluster(plan)
    churn = NodeChurn(sim, plan, seed=2)
    churn._replace()
    assert churn.stats.deleted == ["node-00000"]
    trapped = sim.store.get("ipamblocks", None, cidr_to_name("10.64.0.0/26"))
    assert sum(a is not None for a in trapped["spec"]["allocations"]) == 1 + 1 + plan.pods_per_node
    # Seed 1 drains node-00001: its block keeps only its tunnel IP once its pods went with CNI DEL.
    sim = _cluster(plan)
    churn = NodeChurn(sim, plan, seed=1)
    churn._replace()
    assert sim.cni.borrowed == 1 + plan.pods_per_node  # its tunnel and its pods' IPs
    # A collector deletes the drained node's (now empty, unaffine) block: the CNI may claim it again.
    (gone,) = churn.stats.deleted
    for aff in sim.store.list("blockaffinities")["items"]:
        if aff["spec"]["node"] == gone:
            cidr = aff["spec"]["cidr"]
            block = sim.store.get("ipamblocks", None, cidr_to_name(cidr))
            ordinals = [i for i, a in enumerate(block["spec"]["allocations"]) if a is not None]
            assert len(ordinals) == 1  # its tunnel IP
            sim.store.delete("blockaffinities", None, aff["metadata"]["name"])
            sim.store.delete("ipamblocks", None, block["metadata"]["name"])
    sim.add_node("late")
    assert any(a["spec"]["node"] == "late" for a in sim.store.list("blockaffinities")["items"])
    # A pool with no free address left refuses.
    full = dataclasses.replace(plan, pods_per_node=63, nodes=4)
    sim = _cluster(full)
    churn = NodeChurn(sim, full, seed=2)
    churn._replace()
    assert churn.stats.tunnels_refused == 1 and churn.stats.pods_refused == full.pods_per_node
    assert sim.cni.refused == 1 + full.pods_per_node


def test_plans_refuse_what_cannot_be() -> None:
    with pytest.raises(ValueError, match="power of two"):
        dataclasses.replace(PLAN, pool_blocks=12)
    with pytest.raises(ValueError, match="cannot hold"):
        dataclasses.replace(PLAN, pool_blocks=4)
    with pytest.raises(ValueError, match="abrupt"):
        dataclasses.replace(PLAN, abrupt=1.5)
    for plan in PRESETS.values():
        assert plan.pool_blocks >= plan.nodes and plan.replaced <= plan.nodes


def test_a_preset_scales_to_another_cluster_size() -> None:
    plan = PRESETS["7839"]
    assert plan.scaled(plan.nodes, plan.pods_per_node) is plan
    small = plan.scaled(30, 5)
    assert (small.nodes, small.pods_per_node, small.replaced) == (30, 5, 12)  # 40 % a period, as 100 of 250
    assert small.pool_blocks == 64 and small.pools() == [("10.64.0.0/20", 26)]  # ≥ 30 × 512 / 250
    assert plan.scaled(300, 30).pool_blocks == 1024
