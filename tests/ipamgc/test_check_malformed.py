"""`ipamgc check` on malformed objects: listed with kind, name and reason, skipped, and never a reason to
release (README)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from lab.cluster.objects import ClusterBuilder
from tests.ipamgc.check_helpers import NS, ROOT, _check, _check_json, _rows, _write, assert_contract

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
