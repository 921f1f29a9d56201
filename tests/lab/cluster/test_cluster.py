"""The simulated CNI writes what Calico writes; scenarios leak what they say; the truth judges releases."""

from __future__ import annotations

from typing import Any

import pytest

from lab.apiserver.store import Store
from lab.cluster.cluster import SimCluster
from shared.audit import audit
from shared.blockops import ReleaseRequest, release
from shared.consistency import check_consistency
from shared.names import hostname_hash
from shared.netaddr import cidr_to_name
from shared.parse import parse_block
from shared.snapshot import build_inventory
from shared.verdicts import Release


class Clock:
    def __init__(self) -> None:
        self.t = 1_700_000_000.0

    def __call__(self) -> float:
        self.t += 0.001
        return self.t


@pytest.fixture
def sim() -> SimCluster:
    return SimCluster(Store(), seed=7, pools=[("10.0.0.0/22", 26), ("fd00::/116", 122)], clock=Clock())


def _report(sim: SimCluster, grace: float | None = 900.0) -> Any:
    inv = build_inventory(sim.export()["items"])
    assert not inv.skipped
    return inv, audit(inv, grace)


def _leaked(report: Any) -> set[str]:
    return {r.verdict.allocation.ip for r in report.rows if r.release is not Release.NEVER}


def test_no_leak_injected_means_zero_leaks(sim: SimCluster) -> None:
    sim.populate(nodes=4, pods_per_node=20, dual_stack_every=5)
    sim.delete_pod("ns-1", "pod-0000001")
    sim.create_pod("ns-1", "pod-again", "node-00002")
    inv, report = _report(sim)
    assert report.summary["leaked"] == 0
    assert report.summary["in_use"] == len(sim.truth.in_use_ips())
    assert check_consistency(inv) == []
    assert sim.truth.violations == []


def test_block_claim_is_calicos(sim: SimCluster) -> None:
    sim.add_node("node-a")
    block = sim.store.get("ipamblocks", None, "10-0-0-0-26")
    spec = block["spec"]
    assert spec["affinity"] == "host:node-a"
    assert spec["sequenceNumber"] > 1_600_000_000 * 10**9, "starts at creation time in Unix ns"
    assert spec["allocations"][0] == 0 and spec["unallocated"][0] == 1
    assert spec["sequenceNumberForAllocation"] == {"0": spec["sequenceNumber"] - 1}
    aff = sim.store.get("blockaffinities", None, "node-a-10-0-0-0-26")
    assert aff["spec"] == {
        "state": "confirmed",
        "node": "node-a",
        "type": "host",
        "cidr": "10.0.0.0/26",
        "deleted": "false",
    }
    assert aff["metadata"]["labels"]["projectcalico.org/hostname-hash"] == hostname_hash("node-a")
    # The claim went pending → confirmed: the affinity's spec was written twice.
    assert aff["metadata"]["generation"] == 2
    handle = sim.store.get("ipamhandles", None, "vxlan-tunnel-addr-node-a")
    assert handle["spec"]["block"] == {"10.0.0.0/26": 1}
    parse_block(block)


def test_new_block_when_full_and_borrowing_when_pool_is_exhausted(sim: SimCluster) -> None:
    # 10.0.0.0/22 holds 16 blocks of 64.
    sim.add_node("big")
    for i in range(64 * 16 - 1):
        sim.create_pod("ns", f"p{i}", "big")
    assert len(sim.cni.node_blocks("big", 4)) == 16
    sim.delete_pod("ns", "p5")
    sim.add_node("late")  # its tunnel IP must borrow the only free ordinal, in big's block
    tunnel = sim.store.get("ipamhandles", None, "vxlan-tunnel-addr-late")
    (cidr,) = tunnel["spec"]["block"]
    assert sim.store.get("ipamblocks", None, cidr_to_name(cidr))["spec"]["affinity"] == "host:big"
    inv, report = _report(sim)
    assert report.summary["leaked"] == 0
    assert check_consistency(inv) == []


def test_leak_scenarios_leak_exactly_what_they_say(sim: SimCluster) -> None:
    for n in range(3):
        sim.add_node(f"node-{n}")
    for i in range(12):
        sim.create_pod("default", f"web-{i}", f"node-{i % 3}")
    expected: set[str] = set()
    expected |= set(sim.leak_pod_deleted_without_cni_del("default", "web-0"))
    expected |= set(sim.leak_ip_changed("default", "web-1"))
    expected |= set(sim.leak_terminal_pod("default", "web-2"))
    # Look-alikes that must be kept.
    sim.stale_node_attribute("default", "stale", "node-1", attr_node="node-0")
    sim.dual_stack_single_status("default", "dual", "node-1")
    sim.windows_node("win-0")
    assert sim.truth.leaked_ips() == expected
    inv, report = _report(sim)
    assert _leaked(report) == expected
    by_ip = {r.verdict.allocation.ip: r for r in report.rows}
    assert all(by_ip[ip].release is Release.AFTER_GRACE for ip in expected)
    # Every IP the truth says is in use is judged valid or held back by its handle.
    for ip in sim.truth.in_use_ips():
        assert by_ip[ip].release is Release.NEVER, ip
    assert check_consistency(inv) == []


def test_node_deleted_with_its_pods(sim: SimCluster) -> None:
    sim.add_node("node-0")
    sim.add_node("node-1")
    ips = {ip for i in range(5) for ip in sim.create_pod("default", f"p{i}", "node-1")}
    sim.empty_block("node-1")
    tunnel = next(ip for ip, lives in sim.truth.usages.items() if lives[-1].owner == "tunnel:node-1")
    sim.leak_node_deleted("node-1", remove_pods=False)
    _, report = _report(sim)
    # Pods still exist: Calico keeps everything until the lifecycle controller removes them.
    assert _leaked(report) == set()
    assert sim.truth.leaked_ips() == ips | {tunnel}
    sim.remove_pods_of_node("node-1")
    _, report = _report(sim)
    assert _leaked(report) == ips | {tunnel}
    assert {r.verdict.allocation.ip for r in report.rows if r.release is Release.NOW} == ips | {tunnel}
    assert [e.release for e in report.empty_blocks if e.node == "node-1"] == [Release.NOW]


def test_truth_judges_external_releases(sim: SimCluster) -> None:
    sim.add_node("node-0")
    live = sim.create_pod("default", "live", "node-0")[0]
    leaked = sim.leak_pod_deleted_without_cni_del("default", sim_pod(sim, "gone"))[0]

    def external_release(ip: str) -> None:
        name = cidr_to_name("10.0.0.0/26")
        block = sim.store.get("ipamblocks", None, name)
        block["spec"] = release(block["spec"], [ReleaseRequest(ip)]).spec
        sim.store.replace("ipamblocks", None, name, block)

    external_release(leaked)
    assert sim.truth.violations == []
    assert [u.ip for u in sim.truth.released_leaks()] == [leaked]
    assert sim.truth.release_latencies()[0] > 0
    external_release(live)
    assert [v.ip for v in sim.truth.violations] == [live]
    # The simulator's own CNI DEL is never judged.
    other = sim.create_pod("default", "other", "node-0")[0]
    sim.delete_pod("default", "other")
    assert [v.ip for v in sim.truth.violations] == [live]
    assert other not in sim.truth.in_use_ips()


def sim_pod(sim: SimCluster, name: str) -> str:
    sim.create_pod("default", name, "node-0")
    return name


def test_windows_reserved_ordinals(sim: SimCluster) -> None:
    sim.windows_node("win-0")
    block = parse_block(sim.store.get("ipamblocks", None, "10-0-0-0-26"))
    reserved = [
        o
        for o, i in enumerate(block.allocations)
        if i is not None and block.attributes[i].handle_id == "windows-reserved-ipam-handle"
    ]
    assert reserved == [0, 1, 2, 63]
    inv, report = _report(sim)
    assert {r.verdict.type.value for r in report.rows} == {"reserved", "tunnel"}
    assert report.summary["leaked"] == 0
    assert check_consistency(inv) == []
