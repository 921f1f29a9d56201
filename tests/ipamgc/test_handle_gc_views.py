"""What people see of the handle collector: `ipamgc check` lists each divergent handle with its class,
its repair and when at the earliest; `ipamgc status` counts per class; the audit trail keeps the
evidence (docs/handles.md)."""

from __future__ import annotations

import io

import orjson
from rich.console import Console

from ipamgc.check import run_check
from ipamgc.commands.status import render
from ipamgc.status import read_status
from tests.fixtures.leader import Env
from tests.workers.leader.handle_gc_helpers import (
    drop_handle,
    gc_leader,
    handle_obj,
    orphan,
    passes,
    set_counts,
)

NODE = "node-a"


def _divergent(env: Env) -> tuple[str, str, str]:
    """Three handles out of step: (skewed, missing, orphan)."""
    env.sim.add_node(NODE)
    env.sim.create_pod("ns", "web-0", NODE)
    env.sim.create_pod("ns", "web-1", NODE)
    skewed, _ = env.sim.pod_handles[("ns", "web-0")]
    missing, _ = env.sim.pod_handles[("ns", "web-1")]
    [cidr] = handle_obj(env, skewed)["spec"]["block"]
    set_counts(env, skewed, {cidr: 2})
    drop_handle(env, missing)
    orphan(env, "k8s-pod-network.dead", {cidr: 1})
    return skewed, missing, "k8s-pod-network.dead"


def _check(env: Env, output: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    code = run_check([], output, "15m", False, out, err, live_items=env.sim.export()["items"], now=0.0)
    assert code == 0, err.getvalue()
    return out.getvalue()


def test_check_lists_each_divergent_handle_with_its_class_and_earliest_repair(env: Env) -> None:
    skewed, missing, dead = _divergent(env)
    doc = orjson.loads(_check(env, "json"))
    rows = {h["handle"]: h for h in doc["handle_gc"]["handles"]}
    assert {h: (r["class"], r["action"]) for h, r in rows.items()} == {
        skewed: ("skewed", "set-counts"),
        missing: ("missing", "create"),
        dead: ("orphan", "empty"),
    }
    assert doc["handle_gc"]["repair_after_seconds"] == 900.0  # the grace period; three 5-minute scans fit
    assert rows[missing]["earliest_repair"] == "1970-01-01T00:15:00Z"
    table = _check(env, "table")
    assert "IPAMHandles out of step with their blocks: 3" in table
    assert "set-counts" in table and "at the earliest 1970-01-01T00:15:00Z" in table


def test_check_of_a_cluster_in_step_lists_no_handle(env: Env) -> None:
    env.sim.add_node(NODE)
    env.sim.create_pod("ns", "web-0", NODE)
    assert orjson.loads(_check(env, "json"))["handle_gc"]["handles"] == []
    assert "IPAMHandles" not in _check(env, "table")


def test_status_counts_per_class(env: Env) -> None:
    _divergent(env)
    lead = gc_leader(env)
    passes(env, lead, 3)
    status = read_status(env.redis, env.keys, now=env.clock.now())
    classes = status.handle_gc["classes"]
    assert classes["skewed"]["repaired"] == 1 and classes["missing"]["repaired"] == 1
    assert classes["orphan"] == {"divergent": 1, "due": 0, "repaired": 1, "refused": 0}
    assert status.handle_gc["handles"] is not None and not status.handle_gc["dry_run"]
    text = io.StringIO()
    Console(file=text, width=160).print(render(status))
    assert "handles (last scan" in text.getvalue() and "stuck-deleted" in text.getvalue()
