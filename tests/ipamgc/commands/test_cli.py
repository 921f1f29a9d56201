"""`ipamgc audit` prints the audit stream; `ipamgc lead` takes the leader's flags."""

from __future__ import annotations

import logging
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from ipamgc.commands.audit import audit
from ipamgc.commands.lead import lead
from tests.fixtures.leader import Env
from tests.polling import wait_until
from workers.leader.loop import EXIT_STOPPED


@pytest.fixture(autouse=True)
def _keep_logging() -> Iterator[None]:
    """The commands configure the root logger (as entry points do); put it back afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def _released(env: Env) -> set[str]:
    sim = env.sim
    sim.add_node("node-a")
    sim.add_node("node-dead")
    sim.create_pod("ns", "p1", "node-dead")
    env.decide()
    sim.leak_node_deleted("node-dead")
    env.decide()
    env.leader().step()
    return {u.ip for u in sim.truth.released_leaks()}


def _url(env: Env) -> str:
    kw = env.redis.connection_pool.connection_kwargs
    return f"redis://{kw['host']}:{kw['port']}/0"


def test_audit_prints_one_json_document_even_with_no_records(env: Env) -> None:
    env.redis.hset(env.keys.state, "synced", "1")  # a Redis with ipamgc's data, and no audit record yet
    result = CliRunner().invoke(audit, ["--redis-url", _url(env), "--output", "json"])
    assert result.exit_code == 0, result.output
    assert orjson.loads(result.stdout) == {"redis": _url(env), "records": [], "unreadable": 0, "gaps": []}
    assert result.stderr.splitlines()[0] == f"ipamgc audit: Redis {_url(env)} (--redis-url)"
    ndjson = CliRunner().invoke(audit, ["--redis-url", _url(env), "--output", "ndjson"])
    assert ndjson.exit_code == 0 and ndjson.stdout == ""


def test_audit_prints_json_ndjson_and_a_table(env: Env) -> None:
    ips = _released(env)
    runner = CliRunner()
    result = runner.invoke(audit, ["--redis-url", _url(env), "--output", "ndjson", "--limit", "0"])
    assert result.exit_code == 0, result.output
    lines = [orjson.loads(line) for line in result.stdout.splitlines()]
    doc = orjson.loads(runner.invoke(audit, ["--redis-url", _url(env), "-o", "json", "--limit", "0"]).stdout)
    assert doc["records"] == lines and doc["unreadable"] == 0
    assert {rec["ip"] for rec in lines if rec["result"] == "released" and rec["ip"]} == ips
    pod = next(rec for rec in lines if rec["rule"] == "pod-missing")
    assert set(pod) >= {
        "at",
        "result",
        "ip",
        "handle",
        "block",
        "node",
        "rule",
        "reason",
        "evidence",
        "epoch",
    }
    assert (pod["epoch"], pod["leader"], pod["node"]) == (1, "leader-a", "node-dead")
    # the node is gone (a live 404): the mirrored pod view is used, as Calico uses its cache then
    assert pod["evidence"]["recheck"] | {"pod": None} == {
        "type": "pod",
        "node": "gone",
        "pod_source": "mirror",
        "pod": None,
        "valid": False,
        "reason": "pod-missing",
    }
    assert pod["evidence"]["decision"]["node_exists"] is False

    one = runner.invoke(audit, ["--redis-url", _url(env), "--output", "ndjson", "--limit", "1"])
    assert len(one.stdout.splitlines()) == 1
    table = runner.invoke(audit, ["--redis-url", _url(env)])
    assert table.exit_code == 0 and "released" in table.stdout and "node-dead" in table.stdout
    # Block records have no IP or handle: a dash, never an empty cell or a stray unit.
    block_row = re.compile(r"│ released │ -\s+│ node-dead │ [\d./]+ │ -\s+│ node-missing │")
    assert any(block_row.search(line) for line in table.stdout.splitlines()), table.stdout


def test_lead_takes_the_leaders_flags() -> None:
    result = CliRunner().invoke(lead, ["--help"])
    assert result.exit_code == 0
    for flag in (
        "--redis-url",
        "--kubeconfig",
        "--dry-run",
        "--lease-namespace",
        "--lease-name",
        "--identity",
        "--rate-limit",
        "--leak-grace-period",
    ):
        assert flag in result.output
    bad = CliRunner().invoke(lead, ["--leak-grace-period", "soon"])
    assert bad.exit_code == 2


def test_lead_as_a_process_releases_then_stops_on_sigterm(env: Env, tmp_path: Path) -> None:
    sim = env.sim
    sim.add_node("node-a")
    sim.add_node("node-dead")
    sim.create_pod("ns", "p1", "node-dead")
    env.decide()
    sim.leak_node_deleted("node-dead")
    leaked = sim.truth.leaked_ips()
    assert env.decide() == len(leaked) == 2
    kubeconfig = env.server.write_kubeconfig(tmp_path / "kubeconfig")
    args = [
        "--redis-url",
        _url(env),
        "--kubeconfig",
        str(kubeconfig),
        "--identity",
        "proc",
        "--log-format",
        "json",
    ]
    err = (tmp_path / "stderr").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "ipamgc.commands.lead", *args], stdout=err, stderr=err)
    try:
        wait_until(lambda: sim.truth.leaked_ips() == set(), timeout=20)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == EXIT_STOPPED
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        err.close()
    assert sim.truth.violations == []
    assert {r.ip for r in env.audit() if r.result.value == "released" and r.ip} == leaked
    lease = env.server.store.get("leases", "kube-system", "ipamgc-leader")
    assert not lease["spec"].get("holderIdentity")  # given up on the way out
    log_lines = [
        orjson.loads(line)
        for line in (tmp_path / "stderr").read_bytes().splitlines()
        if line.startswith(b"{")
    ]
    assert any(line.get("epoch") == 1 and line.get("identity") == "proc" for line in log_lines)
