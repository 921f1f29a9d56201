"""`ipamgc release --from-report`: exactly the `release: now` allocations of a `check --output json`
report, each through the leader's guards (live block and sequence number, live re-check, handle
all-or-none, conditional writes), a dry run first, one audit record per IP, and a clear refusal of a
report that is not ipamgc's or is too old.  Against the simulated cluster over HTTP and a real Redis."""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from ipamgc.cli import cli
from kubeio.cluster import read_identity
from lab.apiserver.apiserver import SimApiServer
from lab.apiserver.store import Store
from lab.cluster.cluster import SimCluster
from lab.cluster.objects import node_object, pod_object, put_pod
from tests.fixtures.leader import WRITES, Env

AGENT = "ipamgc-release"


@pytest.fixture(autouse=True)
def _keep_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def _url(env: Env) -> str:
    kw = env.redis.connection_pool.connection_kwargs
    return f"redis://{kw['host']}:{kw['port']}/0"


POOLS = [("10.64.0.0/16", 26), ("fd00:10::/64", 122)]


def _cluster(env: Env) -> None:
    """node-dead is deleted with its pods (dual-stack ones among them): its IPs are `release: now`; a pod
    on live node-a deleted without CNI DEL is only `after-grace`, so the report must not release it."""
    _scenario(env.use_pools(POOLS))


def _scenario(sim: SimCluster) -> None:
    sim.bootstrap("15m")
    sim.add_node("node-a")
    sim.add_node("node-dead")
    sim.create_pod("ns", "web-0", "node-a")
    sim.create_pod("ns", "gone-0", "node-a")
    sim.create_pod("ns", "db-0", "node-dead")
    sim.create_pod("ns", "dual-0", "node-dead", dual_stack=True)
    sim.leak_pod_deleted_without_cni_del("ns", "gone-0")
    sim.leak_node_deleted("node-dead")


def _report(env: Env, tmp_path: Path) -> tuple[dict[str, Any], Path]:
    kubeconfig = env.server.write_kubeconfig(tmp_path / "kubeconfig")
    result = CliRunner().invoke(cli, ["check", "--kubeconfig", str(kubeconfig), "-o", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout), kubeconfig


def _write(doc: dict[str, Any], path: Path) -> Path:
    path.write_text(json.dumps(doc))
    return path


def _release(env: Env, report: Path, kubeconfig: Path, *extra: str) -> Result:
    args = [
        "release",
        "--from-report",
        str(report),
        "--kubeconfig",
        str(kubeconfig),
        "--redis-url",
        _url(env),
    ]
    return CliRunner().invoke(cli, [*args, "-o", "json", *extra])


def _records(result: Result) -> dict[str, tuple[str, str]]:
    return {r["ip"]: (r["result"], r["reason"]) for r in json.loads(result.stdout)["records"]}


def _writes(env: Env) -> list[Any]:
    return [r for r in env.server.requests if r.method in WRITES and r.user_agent == AGENT]


def _now(doc: dict[str, Any]) -> set[str]:
    return {a["ip"] for a in doc["allocations"] if a["release"] == "now"}


def test_dry_run_then_release_exactly_what_the_report_marks_now(env: Env, tmp_path: Path) -> None:
    _cluster(env)
    doc, kubeconfig = _report(env, tmp_path)
    now = _now(doc)
    later = {a["ip"] for a in doc["allocations"] if a["release"] == "after-grace"}
    assert len(now) == 4 and len(later) == 1  # db-0, dual-0's two, node-dead's tunnel; gone-0
    report = _write(doc, tmp_path / "report.json")

    dry = _release(env, report, kubeconfig, "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert _records(dry) == dict.fromkeys(now, ("dry-run", "would release"))
    assert _writes(env) == []  # a dry run writes nothing
    assert env.sim.truth.leaked_ips() == now | later

    done = _release(env, report, kubeconfig)
    assert done.exit_code == 0, done.output
    assert _records(done) == dict.fromkeys(now, ("released", "released"))
    assert {u.ip for u in env.sim.truth.released_leaks()} == now
    assert env.sim.truth.leaked_ips() == later  # after-grace is the running system's, not the report's
    assert env.sim.truth.violations == []
    # One audit record per IP and run, in the stream `ipamgc audit` reads, with the report's evidence.
    audit = env.audit()
    assert sorted(r.result for r in audit) == ["dry-run"] * 4 + ["released"] * 4
    rec = next(r for r in audit if r.result == "released" and r.ip in now)
    assert rec.leader == "ipamgc release --from-report" and rec.epoch == 0
    assert rec.evidence["report"]["file"] == str(report)
    assert rec.evidence["report"]["generated_at"] == doc["report"]["generated_at"]
    assert rec.evidence["recheck"]["valid"] is False

    again = _release(env, report, kubeconfig)
    assert again.exit_code == 0
    assert {v[0] for v in _records(again).values()} == {"already-free"}


def test_a_redis_that_collects_another_cluster_is_refused_and_nothing_is_written_to_either(
    env: Env, tmp_path: Path
) -> None:
    """Cluster A's report and A's Redis, but the kubeconfig of cluster B, built alike (same pools, nodes,
    pods, seed: the same block names and IPs, so every live check on B would pass): refused with one line
    before any write, to B or to A's audit stream; with A's kubeconfig the same command releases."""
    _cluster(env)
    doc, kube_a = _report(env, tmp_path)
    report = _write(doc, tmp_path / "report.json")
    api = env.server.api_client()
    try:  # what A's watcher stamps into its Redis (producer/watcher.py)
        env.redis.hset(env.keys.cluster, mapping=read_identity(api).to_mapping(0.0))
    finally:
        api.close()
    store_b = Store(seed=7)
    with SimApiServer(store_b) as cluster_b:
        twin = SimCluster(store_b, seed=7, pools=POOLS)
        _scenario(twin)
        assert {b["metadata"]["name"] for b in store_b.list("ipamblocks")["items"]} == {
            b["metadata"]["name"] for b in env.server.store.list("ipamblocks")["items"]
        }
        kube_b = cluster_b.write_kubeconfig(tmp_path / "kubeconfig-b")
        refused = _release(env, report, kube_b)
        assert refused.exit_code == 2, refused.output
        line = refused.stderr.splitlines()[-1]  # after the line naming where the audit records go
        assert line.startswith("ipamgc release: error: ") and "collects another cluster" in line
        assert [e for e in refused.stderr.splitlines() if "error" in e] == [line]
        assert [r for r in cluster_b.requests if r.method in WRITES] == []
        assert twin.truth.released_leaks() == [] and twin.truth.violations == []
    assert env.audit() == [] and _writes(env) == []
    done = _release(env, report, kube_a)
    assert done.exit_code == 0, done.output
    assert _records(done) == dict.fromkeys(_now(doc), ("released", "released"))


def test_an_ip_reused_since_the_report_is_never_freed_nor_the_rest_of_its_handle(
    env: Env, tmp_path: Path
) -> None:
    _cluster(env)
    doc, kubeconfig = _report(env, tmp_path)
    dual = [a for a in doc["allocations"] if a["pod"] == "dual-0"]
    assert len(dual) == 2 and {a["release"] for a in dual} == {"now"}
    # The report's sequence number of one of dual-0's IPs is not the block's any more: what the block
    # says when its ordinal was released and allocated again after the report was made.
    stale = copy.deepcopy(doc)
    first = next(a for a in stale["allocations"] if a["ip"] == dual[0]["ip"])
    first["sequence_number"] += 1
    result = _release(env, _write(stale, tmp_path / "stale.json"), kubeconfig)
    assert result.exit_code == 0, result.output
    records = _records(result)
    assert records[dual[0]["ip"]][0] == "refused-conflict"
    assert "re-used since the report" in records[dual[0]["ip"]][1]
    assert records[dual[1]["ip"]] == (
        "held-by-handle",
        f"another IP of the handle is not released: {dual[0]['ip']}",
    )
    freed = {u.ip for u in env.sim.truth.released_leaks()}
    assert freed == _now(doc) - {a["ip"] for a in dual}
    assert env.sim.truth.violations == []


def test_the_live_recheck_refuses_what_is_in_use_again(env: Env, tmp_path: Path) -> None:
    _cluster(env)
    doc, kubeconfig = _report(env, tmp_path)
    db = next(a for a in doc["allocations"] if a["pod"] == "db-0")
    tunnel = next(a for a in doc["allocations"] if a["type"] == "tunnel" and a["node"] == "node-dead")
    # After the report: the node comes back under its name, and db-0 is back with its IP.
    env.server.store.create("nodes", None, node_object("node-dead"))
    put_pod(env.server.store, pod_object("ns", "db-0", "node-dead", [db["ip"]]))
    result = _release(env, _write(doc, tmp_path / "report.json"), kubeconfig)
    records = _records(result)
    assert records[db["ip"]] == ("refused-valid", "pod-running")
    assert records[tunnel["ip"]] == ("refused-valid", "tunnel-node-exists")
    assert db["ip"] not in {u.ip for u in env.sim.truth.released_leaks()}
    assert env.sim.truth.violations == []


def _header(doc: dict[str, Any], **changes: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    out["report"].update(changes)
    return out


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: {k: v for k, v in d.items() if k != "report"}, "not an ipamgc report"),
        (lambda d: {"version": "v3.33", "leaked_ips": []}, "not an ipamgc report"),
        (lambda d: _header(d, generator="someone else"), "not an ipamgc report"),
        (lambda d: _header(d, format=2), "report format 2"),
        (lambda d: _header(d, generated_at="2020-01-01T00:00:00.000Z"), "old (made 2020-01-01"),
        (lambda d: _header(d, generated_at="2999-01-01T00:00:00.000Z"), "made in the future"),
        (lambda d: _header(d, generated_at="yesterday"), "is not a time"),
    ],
    ids=["no-header", "calicoctl", "other-generator", "format", "too-old", "future", "bad-time"],
)
def test_a_report_that_is_not_ipamgcs_or_too_old_is_refused(
    env: Env, tmp_path: Path, mutate: Any, expected: str
) -> None:
    _cluster(env)
    doc, kubeconfig = _report(env, tmp_path)
    result = _release(env, _write(mutate(doc), tmp_path / "bad.json"), kubeconfig)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("ipamgc release: error: ")
    assert expected in result.stderr
    assert _writes(env) == [] and env.audit() == []


def test_the_age_bound_is_max_age_and_an_entry_without_a_sequence_number_is_refused(
    env: Env, tmp_path: Path
) -> None:
    _cluster(env)
    doc, kubeconfig = _report(env, tmp_path)
    old = _write(_header(doc, generated_at="2020-01-01T00:00:00.000Z"), tmp_path / "old.json")
    assert "more than --max-age 1h0m0s" in _release(env, old, kubeconfig, "--dry-run").stderr
    accepted = _release(env, old, kubeconfig, "--dry-run", "--max-age", "100000h")
    assert accepted.exit_code == 0, accepted.output
    unsequenced = copy.deepcopy(doc)
    for a in unsequenced["allocations"]:
        a.pop("sequence_number")
    result = _release(env, _write(unsequenced, tmp_path / "unseq.json"), kubeconfig)
    assert result.exit_code == 2 and "no sequence_number" in result.stderr
