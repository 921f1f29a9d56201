"""`ipamgc check` end to end: snapshots built as Calico writes them, audited, printed as design.md says.

The JSON contract is design.md's "The snapshot format of ipamgc check"; the exit statuses and the handling of
malformed objects are the README's.  Snapshots come from `ClusterBuilder` and from the committed examples.
"""

from __future__ import annotations

import copy
import io
import ipaddress
import json
import re
from pathlib import Path
from typing import Any

import orjson
import pytest

from ipamgc.check import report_header, run_check, to_json
from lab.cluster.ipam import CalicoIPAM, Pool
from lab.cluster.objects import ClusterBuilder, pod_object
from shared.audit import AuditReport, audit
from shared.snapshot import build_inventory
from shared.verdicts import Release

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.json"))
NS = "default"
LGP = 900.0

SUMMARY_KEYS = {"allocations", "in_use", "leaked", "release_now", "release_after_grace"}
ALLOCATION_KEYS = {"ip", "block", "handle", "node", "namespace", "pod", "type", "valid", "reason", "release"}
ALLOCATION_KEYS |= {"sequence_number"}  # added for `release --from-report` (README)
NOW = 1_700_000_000.0  # when the reports of these tests are made
REPORT_KEYS = {"generator", "format", "version", "generated_at", "source"}
EMPTY_BLOCK_KEYS = {"block", "node", "reason", "release"}
TOP_KEYS = {"report", "summary", "allocations", "empty_blocks"}
# Added for the handle collector (docs/handles.md): `ipamgc check` adds it beside `to_json`'s keys.
CHECK_KEYS = TOP_KEYS | {"handle_gc"}
HANDLE_KEYS = {"handle", "name", "class", "recorded", "held", "deleted", "action", "earliest_repair"}
TYPES = {"pod", "tunnel", "vm", "reserved", "unknown"}
RELEASES = {"now", "after-grace", "never"}
KEBAB = re.compile(r"^[a-z]+(-[a-z0-9]+)*$")


# ------------------------------------------------------------------------------------------------------------
# helpers


def _write(tmp_path: Path, doc: Any, name: str = "snapshot.json") -> str:
    path = tmp_path / name
    path.write_bytes(orjson.dumps(doc))
    return str(path)


def _check(sources: list[str], output: str = "json", grace: str = "15m") -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = run_check(sources, output, grace, False, out, err, now=NOW)
    return rc, out.getvalue(), err.getvalue()


def _check_json(tmp_path: Path, doc: Any, grace: str = "15m") -> tuple[dict[str, Any], str]:
    rc, out, err = _check([_write(tmp_path, doc)], "json", grace)
    assert rc == 0, err
    return json.loads(out), err


def _rows(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {a["ip"]: a for a in report["allocations"]}


def _audit(cb: ClusterBuilder, grace: float | None = LGP) -> AuditReport:
    return audit(build_inventory(cb.snapshot()["items"]), grace)


def assert_contract(doc: Any) -> None:
    """design.md: exactly these keys, these types, these enumerations; a summary that adds up."""
    assert isinstance(doc, dict)
    assert set(doc) in (TOP_KEYS, CHECK_KEYS)
    assert set(doc["report"]) == REPORT_KEYS
    if "handle_gc" in doc:
        assert set(doc["handle_gc"]) == {"repair_after_seconds", "handles"}
        assert all(set(h) == HANDLE_KEYS for h in doc["handle_gc"]["handles"])
    assert doc["report"]["generator"] == "ipamgc check" and doc["report"]["format"] == 1
    summary = doc["summary"]
    assert set(summary) == SUMMARY_KEYS
    assert all(type(v) is int and v >= 0 for v in summary.values())
    assert isinstance(doc["allocations"], list)
    for a in doc["allocations"]:
        assert set(a) == ALLOCATION_KEYS, a
        for key in ALLOCATION_KEYS - {"valid", "sequence_number"}:
            assert type(a[key]) is str, (key, a)
        assert type(a["sequence_number"]) is int and a["sequence_number"] >= 0
        assert type(a["valid"]) is bool
        assert a["type"] in TYPES
        assert a["release"] in RELEASES
        assert KEBAB.match(a["reason"]), a["reason"]
        assert a["ip"] and a["block"] and a["handle"]
        if a["valid"]:
            assert a["release"] == "never", a
    assert isinstance(doc["empty_blocks"], list)
    for e in doc["empty_blocks"]:
        assert set(e) == EMPTY_BLOCK_KEYS, e
        assert all(type(v) is str for v in e.values())
        assert e["release"] in RELEASES
        assert KEBAB.match(e["reason"]), e["reason"]
    rows = doc["allocations"]
    assert summary["allocations"] == len(rows) == summary["in_use"] + summary["leaked"]
    assert summary["in_use"] == sum(1 for a in rows if a["valid"])
    assert summary["release_now"] == sum(1 for a in rows if a["release"] == "now")
    assert summary["release_after_grace"] == sum(1 for a in rows if a["release"] == "after-grace")


def _every_kind() -> tuple[ClusterBuilder, dict[str, str]]:
    """A cluster with one allocation of each type, plus leaks; returns the IPs by role."""
    cb = ClusterBuilder()
    cb.add_node("node-1")
    cb.add_node("node-2", tunnel="wireguardTunnelAddress")
    _, [web] = cb.add_pod(NS, "web-0", "node-1")
    _, [orphan] = cb.add_pod(NS, "orphan-0", "node-1")
    cb.delete_pod(NS, "orphan-0", cni_del=False)
    vm = cb.ipam.assign(
        "node-2",
        "k8s-pod-network.vmi.default.vm-0",
        {"node": "node-2", "namespace": NS, "pod": "virt-launcher-vm-0-x", "vmi-name": "vm-0"},
    )
    unknown = cb.ipam.assign("node-2", "lb-abc", {"node": "node-2", "service": "ingress", "namespace": NS})
    windows_block = cb.ipam.claim_block("node-2")
    cb.ipam.reserve_windows(windows_block)
    return cb, {"web": web, "orphan": orphan, "vm": vm, "unknown": unknown, "windows_block": windows_block}


# ------------------------------------------------------------------------------------------------------------
# the JSON contract


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_examples_follow_the_json_contract(path: Path) -> None:
    rc, out, _ = _check([str(path)])
    assert rc == 0
    assert_contract(json.loads(out))


def test_examples_exist() -> None:
    assert {p.stem for p in EXAMPLES} >= {"healthy", "leaks", "malformed"}


def test_to_json_covers_all_five_types(tmp_path: Path) -> None:
    cb, ips = _every_kind()
    doc = to_json(_audit(cb), report_header(NOW, "snapshot"))
    assert_contract(json.loads(orjson.dumps(doc)))
    assert {a["type"] for a in doc["allocations"]} == TYPES
    rows = _rows(doc)
    assert (rows[ips["web"]]["type"], rows[ips["web"]]["reason"], rows[ips["web"]]["release"]) == (
        "pod",
        "pod-running",
        "never",
    )
    assert rows[ips["web"]]["namespace"] == NS and rows[ips["web"]]["pod"] == "web-0"
    assert rows[ips["web"]]["node"] == "node-1"
    assert rows[ips["web"]]["handle"].startswith("k8s-pod-network.")
    assert rows[ips["orphan"]]["type"] == "pod"
    assert (rows[ips["orphan"]]["valid"], rows[ips["orphan"]]["reason"]) == (False, "pod-missing")
    assert rows[ips["orphan"]]["release"] == "after-grace"
    assert rows[ips["vm"]]["type"] == "vm" and rows[ips["vm"]]["release"] == "never"
    assert rows[ips["unknown"]]["type"] == "unknown" and rows[ips["unknown"]]["reason"] == "unknown-source"
    reserved = [a for a in doc["allocations"] if a["type"] == "reserved"]
    assert len(reserved) == 4 and {a["release"] for a in reserved} == {"never"}
    assert {a["block"] for a in reserved} == {ips["windows_block"]}
    tunnels = [a for a in doc["allocations"] if a["type"] == "tunnel"]
    assert {(a["node"], a["reason"], a["release"]) for a in tunnels} == {
        ("node-1", "tunnel-node-exists", "never"),
        ("node-2", "tunnel-node-exists", "never"),
    }
    # Windows-reserved ordinals make a block non-empty (§8.22): it is not an empty block
    assert ips["windows_block"] not in {e["block"] for e in doc["empty_blocks"]}
    # the same document through the command, with its handle listing (nothing out of step here)
    out = json.loads(_check([_write(tmp_path, cb.snapshot())])[1])
    assert out.pop("handle_gc") == {"repair_after_seconds": 900.0, "handles": []}
    assert out == json.loads(orjson.dumps(doc))


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


# ------------------------------------------------------------------------------------------------------------
# run_check: exit statuses and errors


def test_run_check_returns_zero_with_leaks() -> None:
    rc, out, err = _check([str(ROOT / "examples" / "leaks.json")])
    assert rc == 0 and err == ""
    assert json.loads(out)["summary"]["leaked"] > 0


def test_run_check_merges_several_files(tmp_path: Path) -> None:
    snap = json.loads((ROOT / "examples" / "leaks.json").read_text())
    nodes = {**snap, "items": [i for i in snap["items"] if i["kind"] in ("Node", "Pod")]}
    ipam = {**snap, "items": [i for i in snap["items"] if i["kind"] not in ("Node", "Pod")]}
    rc, out, _ = _check([_write(tmp_path, nodes, "a.json"), _write(tmp_path, ipam, "b.json")])
    assert rc == 0
    assert json.loads(out) == json.loads(_check([str(ROOT / "examples" / "leaks.json")])[1])


def _no_nodes() -> dict[str, Any]:
    snap = json.loads((ROOT / "examples" / "leaks.json").read_text())
    snap["items"] = [i for i in snap["items"] if i["kind"] != "Node"]
    return snap


def _no_pods() -> dict[str, Any]:
    snap = json.loads((ROOT / "examples" / "leaks.json").read_text())
    snap["items"] = [i for i in snap["items"] if i["kind"] != "Pod"]
    return snap


def _only(*kinds: str) -> dict[str, Any]:
    snap = json.loads((ROOT / "examples" / "leaks.json").read_text())
    snap["items"] = [i for i in snap["items"] if i["kind"] in kinds]
    return snap


def _tunnels_only_no_pods() -> dict[str, Any]:
    """IPAM objects whose only IPs are tunnel addresses (no pod IP), and no Pod objects."""
    cb = ClusterBuilder()
    cb.add_node("node-1", tunnel="ipipTunnelAddress")
    return cb.snapshot()


@pytest.mark.parametrize(
    ("content", "names_file"),
    [
        pytest.param(None, True, id="missing-file"),
        pytest.param(b"{not json", True, id="not-json"),
        pytest.param(b"", True, id="empty-file"),
        pytest.param(b"[1, 2, 3]", True, id="json-array"),
        pytest.param(b'"a string"', True, id="json-string"),
        pytest.param(b'{"apiVersion": "v1", "kind": "List"}', True, id="list-without-items"),
        pytest.param(b'{"items": {"a": 1}}', True, id="items-not-a-list"),
        pytest.param(orjson.dumps(_no_nodes()), False, id="blocks-but-no-nodes"),
        pytest.param(orjson.dumps(_no_pods()), False, id="pod-ips-but-no-pods"),
        pytest.param(orjson.dumps(_only("Node", "Pod")), False, id="pods-but-no-ipam-objects"),
        pytest.param(orjson.dumps(_only("Pod")), False, id="only-pods"),
        pytest.param(orjson.dumps(_tunnels_only_no_pods()), False, id="ipam-objects-but-no-pods"),
    ],
)
@pytest.mark.parametrize("output", ["json", "table"])
def test_run_check_invalid_input_exits_2_with_one_line(
    tmp_path: Path, content: bytes | None, names_file: bool, output: str
) -> None:
    path = tmp_path / "snapshot.json"
    if content is not None:
        path.write_bytes(content)
    rc, out, err = _check([str(path)], output)
    assert rc == 2
    assert out == ""
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith("ipamgc check: error: ")
    if names_file:
        assert str(path) in err
    else:
        assert "export everything with: kubectl get nodes,pods,ipamblocks" in err


def test_run_check_bad_grace_exits_2() -> None:
    rc, out, err = _check([str(ROOT / "examples" / "healthy.json")], "json", "fifteen minutes")
    assert (rc, out) == (2, "")
    assert err.count("\n") == 1


def test_snapshot_without_blocks_is_fine(tmp_path: Path) -> None:
    doc, err = _check_json(tmp_path, {"apiVersion": "v1", "kind": "List", "items": []})
    assert err == ""
    assert doc.pop("report")["generated_at"] == "2023-11-14T22:13:20.000Z"
    assert doc == {
        "summary": {"allocations": 0, "in_use": 0, "leaked": 0, "release_now": 0, "release_after_grace": 0},
        "allocations": [],
        "empty_blocks": [],
        "handle_gc": {"repair_after_seconds": 900.0, "handles": []},
    }


# ------------------------------------------------------------------------------------------------------------
# malformed objects: listed with kind, name and reason, skipped, and never a reason to release


def test_malformed_example_reports_and_keeps() -> None:
    rc, out, err = _check([str(ROOT / "examples" / "malformed.json")])
    assert rc == 0
    lines = err.strip().splitlines()
    assert len(lines) == 3
    assert any("Pod" in ln and "default/web-0" in ln and "bad-pod-ip" in ln for ln in lines)
    assert any(
        "IPAMBlock" in ln and "10-244-200-0-26" in ln and "allocations-length-mismatch" in ln for ln in lines
    )
    assert any("IPAMBlock" in ln and "10-244-201-0-26" in ln and "missing-spec" in ln for ln in lines)
    doc = json.loads(out)
    assert_contract(doc)
    web0 = [a for a in doc["allocations"] if a["pod"] == "web-0"]
    assert [(a["valid"], a["reason"], a["release"]) for a in web0] == [(True, "pod-ip-unparsable", "never")]
    assert doc["summary"]["leaked"] == 0


def test_malformed_pod_keeps_its_allocation_even_on_a_deleted_node(tmp_path: Path) -> None:
    cb = ClusterBuilder()
    cb.add_node("node-1")
    cb.add_node("node-2")
    _, [ip] = cb.add_pod(NS, "bad", "node-2")
    cb.pods[(NS, "bad")]["status"]["podIPs"] = [{"ip": "10.244.0.999"}]
    cb.delete_node("node-2")
    doc, err = _check_json(tmp_path, cb.snapshot())
    assert "Pod/default/bad" in err and "bad-pod-ip" in err
    row = _rows(doc)[ip]
    assert (row["valid"], row["reason"], row["release"]) == (True, "pod-ip-unparsable", "never")
    tunnel = [a for a in doc["allocations"] if a["node"] == "node-2" and a["type"] == "tunnel"]
    assert [a["release"] for a in tunnel] == ["never"]


def test_an_unparsable_pod_ip_keeps_the_allocation_of_a_finished_pod_too_as_calico_does(
    tmp_path: Path,
) -> None:
    """Calico parses a pod's IPs before it looks at the phase (`getPodIPs`, then `IsFinished`), and its
    cache has no `status.reason`: an evicted or finished pod whose IPs do not parse is kept.  A pod on
    another node is kept: the #12257 fix must read the pod's IPs to know it does not hold this one."""
    cb = ClusterBuilder()
    cb.add_node("node-1")
    cb.add_node("node-2")
    _, [evicted] = cb.add_pod(NS, "evicted", "node-1")
    _, [done] = cb.add_pod(NS, "done", "node-1")
    _, [moved] = cb.add_pod(NS, "moved", "node-1")
    _, [running] = cb.add_pod(NS, "running", "node-1")
    for name in ("evicted", "done", "moved", "running"):
        cb.pods[(NS, name)]["status"]["podIPs"].append({"ip": "not-an-ip"})
    cb.pods[(NS, "evicted")]["status"].update(phase="Failed", reason="Evicted")
    cb.pods[(NS, "done")]["status"]["phase"] = "Succeeded"
    cb.pods[(NS, "moved")]["spec"]["nodeName"] = "node-2"
    doc, err = _check_json(tmp_path, cb.snapshot())
    assert err.count("bad-pod-ip") == 4  # still reported on stderr
    rows = _rows(doc)
    for ip in (evicted, done, moved, running):
        assert (rows[ip]["valid"], rows[ip]["reason"], rows[ip]["release"]) == (
            True,
            "pod-ip-unparsable",
            "never",
        )


def test_pod_without_identity_makes_every_pod_lookup_unknown(tmp_path: Path) -> None:
    cb = ClusterBuilder()
    cb.add_node("node-1")
    _, [ip] = cb.add_pod(NS, "orphan", "node-1")
    cb.delete_pod(NS, "orphan", cni_del=False)
    snap = cb.snapshot()
    snap["items"].append({"apiVersion": "v1", "kind": "Pod", "metadata": {"namespace": NS}, "spec": {}})
    doc, err = _check_json(tmp_path, snap)
    assert "skipped Pod" in err and "missing-metadata" in err
    assert (_rows(doc)[ip]["valid"], _rows(doc)[ip]["release"]) == (True, "never")


def test_malformed_node_counts_as_existing(tmp_path: Path) -> None:
    cb = ClusterBuilder()
    cb.add_node("node-1")
    cb.add_node("node-2")
    cb.add_pod(NS, "web-0", "node-1")
    _, [ip] = cb.add_pod(NS, "a", "node-2")
    cb.delete_pod(NS, "a", cni_del=False)
    cb.nodes["node-2"]["metadata"]["labels"] = {"bad": 7}
    doc, err = _check_json(tmp_path, cb.snapshot())
    assert "Node/node-2" in err
    rows = [a for a in doc["allocations"] if a["node"] == "node-2"]
    assert {a["release"] for a in rows} <= {"never", "after-grace"}
    assert _rows(doc)[ip]["release"] == "after-grace"


def test_malformed_block_holds_its_handles_elsewhere(tmp_path: Path) -> None:
    """A dual-stack pod's IPv6 block is unparsable: its IPv4 (a leak on a deleted node) must not go."""
    cb = ClusterBuilder()
    cb.add_node("node-1")
    cb.add_node("node-2")
    cb.add_pod(NS, "web-0", "node-1")
    _, [v4, v6] = cb.add_pod(NS, "d", "node-2", dual_stack=True)
    cb.delete_node("node-2", with_pods=True)
    snap = cb.snapshot()
    v6_block = next(i for i in snap["items"] if i["kind"] == "IPAMBlock" and ":" in i["spec"]["cidr"])
    v6_block["spec"]["allocations"] = v6_block["spec"]["allocations"][:-1]
    doc, err = _check_json(tmp_path, snap)
    assert "IPAMBlock/" + v6_block["metadata"]["name"] in err and "allocations-length-mismatch" in err
    rows = _rows(doc)
    assert v6 not in rows
    assert rows[v4]["release"] == "never"
    tunnel = [a for a in doc["allocations"] if a["node"] == "node-2" and a["type"] == "tunnel"]
    assert {a["release"] for a in tunnel} == {"never"}


def test_each_skipped_object_is_one_stderr_line(tmp_path: Path) -> None:
    snap = json.loads((ROOT / "examples" / "healthy.json").read_text())
    blocks = [i for i in snap["items"] if i["kind"] == "IPAMBlock"]
    bad = copy.deepcopy(blocks[0])
    bad["metadata"]["name"] = "10-244-250-0-26"
    bad["spec"]["cidr"] = "10.244.250.1/26"
    snap["items"].extend([bad, "not an object"])
    rc, _, err = _check([_write(tmp_path, snap)], "table")
    assert rc == 0
    lines = err.strip().splitlines()
    assert len(lines) == 2
    assert any("IPAMBlock/10-244-250-0-26" in ln and "non-canonical-cidr" in ln for ln in lines)
    assert all(ln.startswith("ipamgc check: warning: skipped ") for ln in lines)


# ------------------------------------------------------------------------------------------------------------
# the table


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
@pytest.mark.parametrize("grace", ["15m", "0", "none"])
def test_table_ends_with_the_summary_line(path: Path, grace: str) -> None:
    rc, out, _ = _check([str(path)], "table", grace)
    assert rc == 0
    last = out.rstrip("\n").splitlines()[-1]
    doc = json.loads(_check([str(path)], "json", grace)[1])
    s = doc["summary"]
    assert last.startswith(f"{s['allocations']} allocations: {s['in_use']} in use, {s['leaked']} leaked ")
    assert f"({s['release_now']} release now, {s['release_after_grace']} after the " in last
    kept = sum(1 for a in doc["allocations"] if not a["valid"] and a["release"] == "never")
    assert f" grace period, {kept} kept); " in last  # every leaked IP is counted
    assert f"{len(doc['empty_blocks'])} empty blocks" in last
    if grace == "none":
        assert "unset" in last


def test_table_lists_leaks_by_node() -> None:
    rc, out, _ = _check([str(ROOT / "examples" / "leaks.json")], "table")
    assert rc == 0
    assert "node node-3 (node deleted)" in out
    assert "pod-missing" in out and "after-grace" in out and "now" in out


def test_the_summary_line_counts_ips_held_by_handle_all_or_none(tmp_path: Path) -> None:
    """A dual-stack pod whose status lists one family: its unreported IPv6 is leaked but kept."""
    cb = ClusterBuilder()
    cb.add_node("node-1")
    cb.add_pod(NS, "dual", "node-1", dual_stack=True)
    cb.pods[(NS, "dual")]["status"]["podIPs"] = cb.pods[(NS, "dual")]["status"]["podIPs"][:1]
    rc, out, _ = _check([_write(tmp_path, cb.snapshot())], "table")
    assert rc == 0
    last = out.rstrip("\n").splitlines()[-1]
    assert "1 leaked (0 release now, 0 after the 15m0s grace period, 1 kept)" in last, last


def test_empty_blocks_carry_their_reason(tmp_path: Path) -> None:
    cb = ClusterBuilder()
    cb.add_node("node-1", tunnel=None)
    cb.ipam.claim_block("node-1")
    cb.ipam.claim_block("node-1")
    cb.add_pod(NS, "web", "node-1")
    doc, _ = _check_json(tmp_path, cb.snapshot())
    assert {e["reason"] for e in doc["empty_blocks"]} == {"empty-block"}
    none, _ = _check_json(tmp_path, cb.snapshot(), grace="none")
    assert {e["reason"] for e in none["empty_blocks"]} == {"block-gc-disabled"}
