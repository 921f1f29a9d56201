"""`ipamgc bench --kube-apiserver`: the collector's API requests are read from kube-apiserver's audit log by
its own identity (the actors' are not counted), a line at a time as the log grows; a directory without
the binaries is refused before anything runs."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

from lab.bench import compile_sources, measure
from lab.bench.backend import RealServer
from lab.bench.config import BenchConfig
from lab.commands.bench import bench


def _event(uid: str, verb: str, resource: str | None, at: str, sub: str | None = None) -> bytes:
    ref = None if resource is None else {"resource": resource, **({"subresource": sub} if sub else {})}
    doc: dict[str, Any] = {
        "kind": "Event",
        "stage": "ResponseComplete",
        "verb": verb,
        "user": {"username": "u", "uid": uid},
        "requestReceivedTimestamp": at,
    }
    if ref is not None:
        doc["objectRef"] = ref
    return json.dumps(doc).encode() + b"\n"


def test_the_collectors_requests_are_counted_from_the_audit_log_and_nobody_elses(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    log.write_bytes(
        _event("collector", "list", "pods", "2026-12-04T10:00:00.100000Z")
        + _event("admin", "create", "pods", "2026-12-04T10:00:00.200000Z")  # an actor's: not counted
        + _event("collector", "get", None, "2026-12-04T10:00:00.300000Z")  # discovery
        + _event("collector", "update", "pods", "2026-12-04T10:00:01.000000Z", "status")
    )
    server = RealServer(SimpleNamespace(audit_log=log, url="https://127.0.0.1:1"), store=None)
    start = 1796378400.0  # 2026-12-04T10:00:00Z
    got = measure.api_requests(server.requests, start, start + 2)
    assert got == {"total": 2, "by_verb": {"list pods": 1, "update pods/status": 1}}
    with log.open("ab") as f:  # the log grows; a half-written line waits for its end
        f.write(_event("collector", "watch", "nodes", "2026-12-04T10:00:01.500000Z"))
        f.write(b'{"kind": "Event", "stage": "Respon')
    assert measure.api_requests(server.requests, start, start + 2)["total"] == 3
    with log.open("ab") as f:
        f.write(
            b'seComplete", "verb": "get", "user": {"uid": "collector"}, "objectRef": {"resource": "pods"}, '
        )
        f.write(b'"requestReceivedTimestamp": "2026-12-04T10:00:01.700000Z"}\n')
    assert measure.api_requests(server.requests, start, start + 2)["total"] == 4


def test_a_directory_without_the_binaries_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"no executable .*kube-apiserver"):
        BenchConfig(kube_apiserver=str(tmp_path))
    result = CliRunner().invoke(bench, ["--kube-apiserver", str(tmp_path), "--nodes", "4"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "no executable" in result.output


def test_the_packages_are_byte_compiled_before_a_run_as_pip_install_does(tmp_path: Path) -> None:
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "rules.py").write_text("X = 1\n")
    compile_sources(tmp_path)
    assert list((tmp_path / "shared" / "__pycache__").glob("rules.*.pyc"))
