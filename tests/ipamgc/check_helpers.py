"""What the tests of `ipamgc check` (`test_check*.py`) share: the committed examples, the keys of design.md's
JSON contract and its check, and `ipamgc check` run on snapshot files."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import orjson

from ipamgc.check import run_check
from lab.cluster.objects import ClusterBuilder
from shared.audit import AuditReport, audit
from shared.snapshot import build_inventory

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
