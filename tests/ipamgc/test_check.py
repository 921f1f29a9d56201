"""`ipamgc check` end to end: snapshots built as Calico writes them, audited, printed as design.md says.

The JSON contract is design.md's "The snapshot format of ipamgc check"; the exit statuses and the handling of
malformed objects are the README's.  Snapshots come from `ClusterBuilder` and from the committed examples.
This module holds the JSON contract and the table; the verdicts on whole clusters, the exit statuses and the
malformed objects are `test_check_verdicts.py`, `test_check_exit.py` and `test_check_malformed.py`.
"""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest

from ipamgc.check import report_header, to_json
from lab.cluster.objects import ClusterBuilder
from tests.ipamgc.check_helpers import (
    EXAMPLES,
    NOW,
    NS,
    ROOT,
    TYPES,
    _audit,
    _check,
    _check_json,
    _rows,
    _write,
    assert_contract,
)


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
