"""`ipamgc check`'s `run_check`: exit statuses, several snapshot files merged, invalid input and a bad grace
period (exit 2 with one line), a snapshot without blocks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from lab.cluster.objects import ClusterBuilder
from tests.ipamgc.check_helpers import ROOT, _check, _check_json, _write

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
