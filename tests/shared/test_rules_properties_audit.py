"""The validity rules' properties (a), (b) and (c) (`test_rules_properties.py`) end to end: IPAM data as
Calico's CNI plugin writes it (`ClusterBuilder`), audited from a snapshot."""

from __future__ import annotations

import ipaddress
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from lab.cluster.objects import ClusterBuilder, node_object, pod_object
from shared.audit import AuditReport, audit
from shared.snapshot import build_inventory
from shared.verdicts import LeakState, Release
from tests.shared.properties_helpers import ALL_PHASES, NODES, NS, SETTINGS, TUNNEL_TYPES, _spellings, graces

# ----------------------------------------------------------------------------------------------------
# The same properties end to end: IPAM data as Calico's CNI writes it, audited from a snapshot


@dataclass(frozen=True)
class Workload:
    name: str
    attr_node: str  # what the CNI wrote into the allocation's `node` attribute
    pod_node: str  # where the pod runs ("" = not scheduled)
    dual_stack: bool
    exists: bool
    phase: str
    report: str  # "all" | "v4" | "none"
    deleting: bool


workloads = st.builds(
    Workload,
    name=st.just(""),
    attr_node=st.sampled_from(NODES),
    pod_node=st.sampled_from((*NODES, "")),
    dual_stack=st.booleans(),
    exists=st.booleans(),
    phase=st.sampled_from(ALL_PHASES),
    report=st.sampled_from(("all", "v4", "none")),
    deleting=st.booleans(),
)


@dataclass
class Cluster:
    report: AuditReport
    live_ips: set[str]  # IPs a live, non-terminal pod reports
    live_nodes: set[str]


@st.composite
def clusters(draw: st.DrawFn) -> Cluster:
    cb = ClusterBuilder()
    live_nodes = set(draw(st.lists(st.sampled_from(NODES), unique=True, min_size=1)))
    for node in NODES:
        cb.nodes[node] = node_object(node)
        if draw(st.booleans()):
            cb.add_tunnel(node, draw(st.sampled_from(TUNNEL_TYPES)))
    live_ips: set[str] = set()
    for i, w in enumerate(draw(st.lists(workloads, max_size=8))):
        name = f"w-{i}"
        _, ips = cb.cni_add(NS, name, w.attr_node, dual_stack=w.dual_stack)
        if not w.exists:
            continue
        shown = {"all": ips, "v4": ips[:1], "none": []}[w.report]
        spelled = [draw(_spellings(ipaddress.ip_address(ip))) for ip in shown]
        annotations = {"cni.projectcalico.org/podIP": f"{ips[0]}/32"} if draw(st.booleans()) else {}
        obj = pod_object(NS, name, w.pod_node, spelled, w.phase, annotations=annotations)
        if w.deleting:
            obj["metadata"]["deletionTimestamp"] = "2025-01-21T18:00:00Z"
        cb.pods[(NS, name)] = obj
        if w.phase not in ("Succeeded", "Failed", "Completed"):
            live_ips.update(shown)
    if draw(st.booleans()):
        cb.ipam.claim_block(draw(st.sampled_from(NODES)))
    for node in set(NODES) - live_nodes:
        cb.delete_node(node)
    grace = draw(graces)
    inv = build_inventory(cb.snapshot()["items"])
    assert not inv.skipped
    return Cluster(audit(inv, grace), live_ips, live_nodes)


@SETTINGS
@given(cluster=clusters())
def test_a_audit_never_releases_an_ip_a_live_pod_reports(cluster: Cluster) -> None:
    rows = {r.verdict.allocation.ip: r for r in cluster.report.rows}
    for ip in cluster.live_ips:
        assert rows[ip].verdict.valid, rows[ip]
        assert rows[ip].release is Release.NEVER


@SETTINGS
@given(cluster=clusters())
def test_b_audit_releases_nothing_on_a_live_node_now(cluster: Cluster) -> None:
    for r in cluster.report.rows:
        if r.verdict.allocation.node in cluster.live_nodes:
            assert r.verdict.state is not LeakState.CONFIRMED
            assert r.release is not Release.NOW
    for e in cluster.report.empty_blocks:
        if e.node in cluster.live_nodes:
            assert e.release is not Release.NOW  # no timers in a one-shot audit: never two observations


@SETTINGS
@given(cluster=clusters())
def test_c_audit_handle_with_a_valid_ip_releases_nothing(cluster: Cluster) -> None:
    by_handle: dict[str, list[Any]] = defaultdict(list)
    for r in cluster.report.rows:
        by_handle[r.verdict.allocation.handle].append(r)
    for rows in by_handle.values():
        if any(r.verdict.valid for r in rows):
            assert {r.release for r in rows} == {Release.NEVER}
        releases = {r.release for r in rows}
        assert len(releases) == 1, rows  # all-or-none: one decision per handle
    summary = cluster.report.summary
    assert summary["allocations"] == summary["in_use"] + summary["leaked"] == len(cluster.report.rows)
