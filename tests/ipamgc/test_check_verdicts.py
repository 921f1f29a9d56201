"""`ipamgc check`'s verdicts on whole clusters: deleted nodes and their pods, empty and unaffine blocks, the
grace period unset or zero, VMs, dual stack, stale node attributes, terminal pods, Windows nodes."""

from __future__ import annotations

import ipaddress
import json

import pytest

from ipamgc.check import report_header, to_json
from lab.cluster.ipam import CalicoIPAM, Pool
from lab.cluster.objects import ClusterBuilder, pod_object
from shared.verdicts import Release
from tests.ipamgc.check_helpers import LGP, NOW, NS, ROOT, _audit, _check, assert_contract

# ------------------------------------------------------------------------------------------------------------
# verdicts on whole clusters


def test_leaks_example_verdicts() -> None:
    rc, out, err = _check([str(ROOT / "examples" / "leaks.json")])
    assert (rc, err) == (0, "")
    doc = json.loads(out)
    by_pod = {a["pod"]: a for a in doc["allocations"] if a["type"] == "pod" and ":" not in a["ip"]}
    moved = [a for a in doc["allocations"] if a["pod"] == "moved-0"]
    assert sorted((a["reason"], a["release"]) for a in moved) == [
        ("pod-ip-mismatch", "after-grace"),
        ("pod-running", "never"),
    ]
    assert (by_pod["orphan-0"]["reason"], by_pod["orphan-0"]["release"]) == ("pod-missing", "after-grace")
    assert by_pod["report-28871"]["reason"] == "pod-terminated"
    assert (by_pod["stale-0"]["valid"], by_pod["stale-0"]["reason"]) == (True, "stale-node-attribute")
    assert {(by_pod[p]["reason"], by_pod[p]["release"]) for p in ("gone-0", "gone-1")} == {
        ("pod-missing", "now")
    }
    dual = [a for a in doc["allocations"] if a["pod"] == "dual-0"]
    assert {(a["valid"], a["release"]) for a in dual} == {(True, "never"), (False, "never")}
    tunnels = {a["node"]: a for a in doc["allocations"] if a["type"] == "tunnel"}
    assert (tunnels["node-3"]["reason"], tunnels["node-3"]["release"]) == ("node-missing", "now")
    assert {tunnels[n]["release"] for n in ("node-1", "node-2")} == {"never"}
    lb = [a for a in doc["allocations"] if a["handle"].startswith("lb-")]
    assert [(a["node"], a["valid"], a["release"], a["reason"]) for a in lb] == [
        ("", True, "never", "no-node-attribute")
    ]
    empties = {(e["node"], e["release"]) for e in doc["empty_blocks"]}
    assert empties == {("node-1", "after-grace"), ("node-3", "now")}


def test_healthy_example_has_no_leaks() -> None:
    doc = json.loads(_check([str(ROOT / "examples" / "healthy.json")])[1])
    assert doc["summary"]["leaked"] == 0
    assert {a["release"] for a in doc["allocations"]} == {"never"}
    pending = [a for a in doc["allocations"] if a["pod"] == "job-starting"]
    assert [a["reason"] for a in pending] == ["no-pod-ip-yet"]


def test_deleted_node_with_its_pods_goes_now_including_tunnel_and_empty_blocks() -> None:
    cb = ClusterBuilder()
    cb.add_node("node-1")
    cb.add_node("node-2", tunnel="ipipTunnelAddress")
    cb.add_pod(NS, "a", "node-2", dual_stack=True)
    cb.add_pod(NS, "b", "node-2")
    spare = cb.ipam.claim_block("node-2")
    cb.delete_node("node-2", with_pods=True)
    for grace in (None, 0.0, LGP):
        report = _audit(cb, grace)
        on_2 = [r for r in report.rows if r.verdict.allocation.node == "node-2"]
        assert len(on_2) == 4
        assert {r.release for r in on_2} == {Release.NOW}, grace
        assert {(e.block, e.release) for e in report.empty_blocks if e.node == "node-2"} == {
            (spare, Release.NOW)
        }
        assert report.gone_nodes == {"node-2"}
        assert all(r.release is Release.NEVER for r in report.rows if r.verdict.allocation.node == "node-1")


def test_deleted_node_waits_while_its_pods_exist() -> None:
    """§10 / §4.1: pods still present and matching keep their IPs, the tunnel and the node's blocks."""
    cb = ClusterBuilder()
    cb.add_node("node-1")
    cb.add_node("node-2")
    _, [kept] = cb.add_pod(NS, "a", "node-2")
    cb.add_pod(NS, "b", "node-2")
    cb.delete_pod(NS, "b", cni_del=False)
    spare = cb.ipam.claim_block("node-2")
    cb.delete_node("node-2", with_pods=False)
    report = _audit(cb)
    rows = {r.verdict.allocation.ip: r for r in report.rows if r.verdict.allocation.node == "node-2"}
    assert (rows[kept].verdict.valid, rows[kept].release) == (True, Release.NEVER)
    reasons = {r.verdict.reason.value: r.release for r in rows.values()}
    assert reasons == {"pod-running": Release.NEVER, "pod-missing": Release.NOW, "node-in-use": Release.NEVER}
    # the node is not releasable, so its spare empty block waits for its grace period like a live node's
    assert {(e.block, e.release) for e in report.empty_blocks if e.node == "node-2"} == {
        (spare, Release.AFTER_GRACE)
    }


def test_deleted_node_with_only_empty_blocks_releases_them_now() -> None:
    cb = ClusterBuilder()
    cb.add_node("node-1")
    block = cb.ipam.claim_block("node-2")  # node-2 has no Node object: it is gone
    report = _audit(cb, None)
    assert [(e.block, e.node, e.release) for e in report.empty_blocks] == [(block, "node-2", Release.NOW)]
    assert report.gone_nodes == {"node-2"}


def test_small_blocks() -> None:
    """§10: small (/32) blocks are handled like any other: the tunnel's and the pod's blocks are kept."""
    ipam = CalicoIPAM(pools=[Pool(ipaddress.ip_network("10.0.0.0/29"), 32)])
    cb = ClusterBuilder(ipam=ipam)
    cb.add_node("node-1")
    _, [kept] = cb.add_pod(NS, "kept", "node-1")
    _, [freed] = cb.add_pod(NS, "freed", "node-1")
    cb.delete_pod(NS, "freed", cni_del=True)
    spare = cb.ipam.claim_block("node-1")
    report = _audit(cb)
    assert {r.verdict.allocation.ip: r.release for r in report.rows} == {
        "10.0.0.0": Release.NEVER,
        kept: Release.NEVER,
    }
    assert {e.block: e.release for e in report.empty_blocks} == {
        f"{freed}/32": Release.AFTER_GRACE,
        spare: Release.AFTER_GRACE,
    }


def test_empty_blocks_of_live_nodes() -> None:
    """Never a live node's last block; otherwise after the grace period; never with grace 0 or unset."""
    cb = ClusterBuilder()
    cb.add_node("node-1", tunnel=None)
    only = cb.ipam.claim_block("node-1")
    cb.add_node("node-2")
    extra = cb.ipam.claim_block("node-2")
    cb.add_node("node-3", labels={"projectcalico.org/node-network-during-migration": "flannel"})
    migrating = cb.ipam.claim_block("node-3")
    cb.add_node("node-4", labels={"projectcalico.org/node-network-during-migration": "calico"})
    migrated = cb.ipam.claim_block("node-4")
    expected = {
        LGP: {
            only: Release.NEVER,
            extra: Release.AFTER_GRACE,
            migrating: Release.NEVER,
            migrated: Release.AFTER_GRACE,
        },
        0.0: {only: Release.NEVER, extra: Release.NEVER, migrating: Release.NEVER, migrated: Release.NEVER},
        None: {only: Release.NEVER, extra: Release.NEVER, migrating: Release.NEVER, migrated: Release.NEVER},
    }
    for grace, want in expected.items():
        report = _audit(cb, grace)
        assert {e.block: e.release for e in report.empty_blocks} == want, grace


def test_unaffine_and_virtual_blocks_are_never_empty_blocks() -> None:
    cb = ClusterBuilder()
    cb.add_node("node-1")
    cb.ipam.claim_block("node-1")
    cidr = cb.ipam.claim_block("node-1")
    cb.ipam.blocks[cidr]["spec"]["affinity"] = None
    cidr2 = cb.ipam.claim_block("node-1")
    cb.ipam.blocks[cidr2]["spec"]["affinity"] = "virtual:load-balancer"
    blocks = {e.block for e in _audit(cb).empty_blocks}
    assert cidr not in blocks and cidr2 not in blocks


def _unaffine_windows_block(owner_alive: bool, pod_exists: bool) -> tuple[ClusterBuilder, str, str]:
    """win-1's block, its affinity given up while it lends an IP to a pod of node-1 (or node-2, deleted)."""
    cb = ClusterBuilder()
    cb.add_node("node-1")
    cb.add_node("node-2")
    cidr = cb.ipam.claim_block("win-1")
    cb.ipam.reserve_windows(cidr)
    node = "node-1" if owner_alive else "node-2"
    ip = cb.ipam.assign_in_block(cidr, "k8s-pod-network.borrow", {"namespace": NS, "node": node, "pod": "b"})
    if pod_exists:
        cb.pods[(NS, "b")] = pod_object(NS, "b", node, [ip])
    if not owner_alive:
        cb.delete_node("node-2")
    cb.ipam.blocks[cidr]["spec"]["affinity"] = None
    return cb, cidr, ip


@pytest.mark.parametrize(
    ("owner_alive", "pod_exists", "fate"),
    [
        pytest.param(True, False, Release.AFTER_GRACE, id="leak-on-a-live-node"),
        pytest.param(False, False, Release.NOW, id="leak-on-a-deleted-node"),
        pytest.param(True, True, None, id="ip-in-use"),
    ],
)
def test_check_lists_an_unaffine_block_its_releases_leave_with_only_windows_reserved_ordinals(
    owner_alive: bool, pod_exists: bool, fate: Release | None
) -> None:
    """The leader deletes such a block with its last release (as Calico's library); `check` says so."""
    cb, cidr, ip = _unaffine_windows_block(owner_alive, pod_exists)
    report = _audit(cb)
    rows = {r.verdict.allocation.ip: r for r in report.rows}
    assert rows[ip].release is (fate or Release.NEVER)
    reserved = [
        r for r in report.rows if r.verdict.allocation.block == cidr and r.verdict.type.value == "reserved"
    ]
    assert len(reserved) == 4 and {r.release for r in reserved} == {
        Release.NEVER
    }  # not leaks: no row changes
    listed = [(e.block, e.node, e.reason.value, e.release) for e in report.empty_blocks if e.block == cidr]
    assert listed == ([] if fate is None else [(cidr, "", "unaffine-block", fate)])
    doc = to_json(report, report_header(NOW, "snapshot"))
    assert_contract(doc)


def test_check_does_not_list_a_windows_block_that_keeps_its_affinity() -> None:
    cb, cidr, _ = _unaffine_windows_block(owner_alive=True, pod_exists=False)
    cb.ipam.blocks[cidr]["spec"]["affinity"] = "host:win-1"
    cb.add_node("win-1", tunnel=None)
    assert [e for e in _audit(cb).empty_blocks if e.block == cidr] == []


def test_grace_unset_keeps_live_node_leaks_but_not_deleted_node_leaks() -> None:
    cb = ClusterBuilder()
    cb.add_node("node-1")
    cb.add_node("node-2")
    _, [orphan] = cb.add_pod(NS, "orphan", "node-1")
    cb.delete_pod(NS, "orphan", cni_del=False)
    _, [gone] = cb.add_pod(NS, "gone", "node-2")
    cb.delete_node("node-2", with_pods=True)
    rows = {r.verdict.allocation.ip: r for r in _audit(cb, None).rows}
    assert (rows[orphan].verdict.valid, rows[orphan].release) == (False, Release.NEVER)
    assert rows[gone].release is Release.NOW


def test_grace_zero_candidates_are_never_released() -> None:
    """§3.6 markLeak / §4 'LGP = 0': candidates are never confirmed, so the audit must say never."""
    cb = ClusterBuilder()
    cb.add_node("node-1")
    _, [orphan] = cb.add_pod(NS, "orphan", "node-1")
    cb.delete_pod(NS, "orphan", cni_del=False)
    # one handle, one IP on a live node (a candidate) and one on a deleted node (confirmed)
    attrs = {"namespace": NS, "pod": "split"}
    live = cb.ipam.assign("node-1", "k8s-pod-network.split", {**attrs, "node": "node-1"})
    gone = cb.ipam.assign("node-2", "k8s-pod-network.split", {**attrs, "node": "node-2"})
    rows = {r.verdict.allocation.ip: r for r in _audit(cb, 0.0).rows}
    assert rows[orphan].verdict.valid is False
    assert rows[orphan].release is Release.NEVER
    assert (rows[live].release, rows[gone].release) == (Release.NEVER, Release.NEVER)
    rows = {r.verdict.allocation.ip: r for r in _audit(cb, LGP).rows}
    assert rows[orphan].release is Release.AFTER_GRACE
    assert (rows[live].release, rows[gone].release) == (Release.AFTER_GRACE, Release.AFTER_GRACE)


def test_vm_allocations_are_kept_without_a_kubevirt_view() -> None:
    """§3.8: KubeVirt absent ⇒ valid.  A snapshot carries no VMs, so a VM allocation is kept at any grace."""
    cb = ClusterBuilder()
    cb.add_node("node-1")
    vm = cb.ipam.assign(
        "node-1",
        "k8s-pod-network.vmi.default.vm-0",
        {"node": "node-1", "namespace": NS, "pod": "l", "vmi-name": "v"},
    )
    cb.delete_node("node-1")
    for grace in (None, 0.0, LGP):
        rows = {r.verdict.allocation.ip: r for r in _audit(cb, grace).rows}
        assert (rows[vm].verdict.type.value, rows[vm].verdict.reason.value) == ("vm", "kubevirt-absent")
        assert rows[vm].release is Release.NEVER


def test_dual_stack_single_stack_status_keeps_both() -> None:
    """§8.1 (#5044), on a live and on a deleted node."""
    cb = ClusterBuilder()
    cb.add_node("node-1")
    cb.add_node("node-2")
    _, ips1 = cb.add_pod(NS, "d1", "node-1", dual_stack=True)
    cb.set_pod_ips(NS, "d1", ips1[:1])
    _, ips2 = cb.add_pod(NS, "d2", "node-2", dual_stack=True)
    cb.set_pod_ips(NS, "d2", ips2[:1])
    cb.delete_node("node-2")
    rows = {r.verdict.allocation.ip: r for r in _audit(cb).rows}
    for v4, v6 in (ips1, ips2):
        assert rows[v4].verdict.valid and not rows[v6].verdict.valid
        assert rows[v4].release is rows[v6].release is Release.NEVER


def test_stale_node_attribute_is_kept() -> None:
    """#12257 fixed: CNI wrote node-1, the pod runs on node-2 and reports the IP → valid, kept."""
    cb = ClusterBuilder()
    cb.add_node("node-1")
    cb.add_node("node-2")
    _, [stale] = cb.cni_add(NS, "s", "node-1")
    cb.pods[(NS, "s")] = pod_object(NS, "s", "node-2", [stale])
    _, [moved] = cb.cni_add(NS, "m", "node-1")
    cb.pods[(NS, "m")] = pod_object(NS, "m", "node-2", ["10.244.200.1"])
    rows = {r.verdict.allocation.ip: r for r in _audit(cb).rows}
    assert (rows[stale].verdict.reason.value, rows[stale].release) == ("stale-node-attribute", Release.NEVER)
    assert (rows[moved].verdict.reason.value, rows[moved].release) == (
        "pod-on-other-node",
        Release.AFTER_GRACE,
    )


def test_terminal_and_evicted_pods_are_candidates() -> None:
    cb = ClusterBuilder()
    cb.add_node("node-1")
    _, [done] = cb.add_pod(NS, "done", "node-1", phase="Succeeded")
    _, [evicted] = cb.add_pod(NS, "ev", "node-1", phase="Failed", reason="Evicted")
    _, [waiting] = cb.add_pod(NS, "wait", "node-1", phase="Pending", report=False)
    rows = {r.verdict.allocation.ip: r for r in _audit(cb).rows}
    assert (rows[done].verdict.reason.value, rows[done].release) == ("pod-terminated", Release.AFTER_GRACE)
    assert (rows[evicted].verdict.reason.value, rows[evicted].release) == ("pod-evicted", Release.AFTER_GRACE)
    assert (rows[waiting].verdict.reason.value, rows[waiting].release) == ("no-pod-ip-yet", Release.NEVER)


def test_deleted_node_with_unknown_source_allocation_is_not_cleaned() -> None:
    cb = ClusterBuilder()
    cb.add_node("node-1")
    cb.add_node("node-2")
    cb.ipam.assign("node-2", "lb-x", {"node": "node-2", "service": "s", "namespace": NS})
    spare = cb.ipam.claim_block("node-2")
    cb.delete_node("node-2")
    report = _audit(cb)
    tunnel = [
        r for r in report.rows if r.verdict.allocation.node == "node-2" and r.verdict.type.value == "tunnel"
    ]
    assert [(r.verdict.reason.value, r.release) for r in tunnel] == [("node-in-use", Release.NEVER)]
    assert {(e.block, e.release) for e in report.empty_blocks if e.node == "node-2"} == {
        (spare, Release.AFTER_GRACE)
    }


def test_deleted_windows_node_is_cleaned_despite_reserved_ordinals() -> None:
    cb = ClusterBuilder()
    cb.add_node("node-1")
    cb.add_node("win-1", tunnel=None)
    cb.ipam.reserve_windows(cb.ipam.claim_block("win-1"))
    cb.add_tunnel("win-1")
    cb.delete_node("win-1")
    report = _audit(cb)
    tunnel = [
        r for r in report.rows if r.verdict.type.value == "tunnel" and r.verdict.allocation.node == "win-1"
    ]
    assert [(r.verdict.reason.value, r.release) for r in tunnel] == [("node-missing", Release.NOW)]
    reserved = [r for r in report.rows if r.verdict.type.value == "reserved"]
    assert len(reserved) == 4 and {r.release for r in reserved} == {Release.NEVER}
