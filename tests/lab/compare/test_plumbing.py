"""`ipamgc compare` end to end without Calico's binary: a stand-in kube-controllers that syncs and does
nothing, against ipamgc's real components (redis-server, worker, leader, watcher) on the sandboxed
simulated cluster.  Every leak ipamgc releases must then be reported, and nothing else: the differences
are exactly the scenario's leaks, "released by ipamgc, kept by Calico", undeclared.

With `$IPAMGC_CALICO_KUBE_CONTROLLERS` set to a real kube-controllers binary, `test_real_binary` also
compares against it (opt-in: CI has no binary; see docs/compare.md)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from lab.compare.diff import UNDECLARED
from lab.compare.run import compare_cluster
from lab.kubecontrollers import ENV_VAR, parse_binaries
from tests import scenarios

GRACE = 1.0
STAND_IN = f"""#!{sys.executable}
import signal, sys, threading
print('time="now" level=info msg="Syncer is InSync, kicking sync channel"', flush=True)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
threading.Event().wait()
"""


@pytest.fixture
def stand_in(tmp_path: Path) -> Path:
    path = tmp_path / "kube-controllers-that-does-nothing"
    path.write_text(STAND_IN)
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("name", ["pod-deleted-without-cni-del", "deleted-node-with-its-pods"])
def test_against_a_collector_that_does_nothing_the_differences_are_the_leaks(
    stand_in: Path, name: str
) -> None:
    doc, leaks = scenarios.SCENARIOS[name]()
    result = compare_cluster(name, doc["items"], stand_in, GRACE, "1s")
    assert result.complete, (result.calico, result.ipamgc)
    assert result.calico.writes == 0 and result.calico.ready is not None
    allocations = [d for d in result.differences if d.kind == "allocation"]
    assert {d.subject for d in allocations} == leaks
    assert {(d.what, d.calico, d.cls) for d in allocations} == {("ipamgc-only", None, UNDECLARED)}
    assert all(d.truth.startswith("leaked") for d in allocations)
    # a deleted node's affinities go too (its blocks, once empty, with them); a live node keeps its block
    others = {(d.kind, d.detail) for d in result.differences if d.kind != "allocation"}
    expected_nodes = {"node-2"} if name == "deleted-node-with-its-pods" else set()
    assert {node for _, node in others} == expected_nodes
    assert result.undeclared == len(result.differences)


@pytest.mark.skipif(
    not os.environ.get(ENV_VAR), reason=f"opt-in: set ${ENV_VAR} to Calico's kube-controllers"
)
def test_real_binary() -> None:
    (binary,) = parse_binaries(os.environ[ENV_VAR])
    doc, _ = scenarios.SCENARIOS["pod-deleted-without-cni-del"]()
    result = compare_cluster("real", doc["items"], binary.path, 3.0, "3s")
    assert result.complete
    assert result.differences == []


def test_a_snapshot_with_malformed_objects_is_compared_not_crashed_on(stand_in: Path) -> None:
    """`examples/malformed.json` holds a block without a spec (among other broken objects): the sandbox
    skips it when it derives the pools, both collectors run, and the result is a comparison."""
    import orjson

    items = orjson.loads(Path("examples/malformed.json").read_bytes())["items"]
    result = compare_cluster("malformed", items, stand_in, GRACE, "1s")
    assert result.ipamgc.error == "" and result.calico.ready is not None
