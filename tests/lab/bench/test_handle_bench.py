"""`ipamgc bench --leaked-handles N` at a small size: every leaked handle emptied then deleted, the others
untouched, on the virtual clock the rate limit reads (two grace periods at least), with its requests
counted and the report's table printed by the command."""

from __future__ import annotations

from pathlib import Path

import orjson
from click.testing import CliRunner

from lab.bench.handles import GRACE, run_handle_bench
from lab.commands.bench import bench


def test_the_handle_scenario_cleans_every_leaked_handle_and_nothing_else() -> None:
    r = run_handle_bench(200, 40, nodes=4, rate_limit=10.0)
    assert r["handles_after"] == r["handles_before"] - 40 == r["pods"] + 4  # a tunnel handle per node
    assert r["emptied"] == r["deleted"] == 40
    assert r["requests"]["delete ipamhandles"] == 40
    assert r["requests"]["update ipamhandles"] == 40
    assert "update ipamblocks" not in r["requests"] and "create ipamhandles" not in r["requests"]
    assert r["virtual_seconds_to_clean"] >= 2 * GRACE  # two windows: emptied, then deleted
    assert r["scans"] >= 6 and r["leader_cpu_seconds"] > 0


def test_the_bench_command_runs_it_apart_from_the_modes(tmp_path: Path) -> None:
    out = tmp_path / "handles.json"
    args = ["--leaked-handles", "10", "--nodes", "2", "--pods-per-node", "20", "-q"]
    args += ["--output-file", str(out)]
    result = CliRunner().invoke(bench, args)
    assert result.exit_code == 0, result.output
    assert "10 leaked IPAMHandles at 40 pods" in result.output
    assert orjson.loads(out.read_bytes())["deleted"] == 10
