"""The decisions stream: consumer group, malformed entries, reclaiming after a crash, dry runs."""

from __future__ import annotations

import dataclasses

from shared.gcrecords import decode_decision, encode_decision
from tests.fixtures.leader import WRITES, Env
from workers.leader.audit import Result
from workers.leader.loop import DRY_RUN_GROUP, GROUP


def _dead_node(env: Env) -> set[str]:
    sim = env.sim
    sim.add_node("node-a")
    sim.add_node("node-dead")
    sim.create_pod("ns", "p1", "node-dead")
    sim.create_pod("ns", "p2", "node-dead", dual_stack=True)
    env.decide()
    sim.leak_node_deleted("node-dead")
    leaked = sim.truth.leaked_ips()
    assert env.decide() == len(leaked) == 4
    return leaked


def test_malformed_entries_are_logged_counted_acked_and_never_released(env: Env) -> None:
    leaked = _dead_node(env)
    _, fields = env.redis.xrange(env.keys.decisions, count=1)[0]
    good = decode_decision(fields[b"d"])
    lying = dataclasses.replace(good, ip="10.255.255.1")  # the id names another IP than the fields
    env.redis.xadd(env.keys.decisions, {"id": "x", "d": b"\x93not-a-record"})
    env.redis.xadd(env.keys.decisions, {"id": "y"})
    env.redis.xadd(env.keys.decisions, {"id": lying.alloc_id, "d": encode_decision(lying)})
    lead = env.leader()
    lead.step()
    errors = [r for r in env.audit() if r.result is Result.ERROR]
    assert len(errors) == 3 and all(r.reason.startswith("malformed decision") for r in errors)
    assert lead.stats.malformed == 3
    assert {r.ip for r in env.audit() if r.result is Result.RELEASED and r.ip} == leaked  # the rest goes on
    assert env.pending() == 0


def test_a_crashed_leaders_pending_decisions_are_reclaimed_by_the_next(env: Env) -> None:
    leaked = _dead_node(env)
    crashed = env.leader("leader-a")
    taken = crashed.fence.read(env.keys.decisions, GROUP, "leader-a", 100)  # read, then killed: no ack
    assert len(taken) == 4 and env.pending() == 4
    env.server.clear_requests()

    successor = env.leader("leader-b")  # a new epoch; XAUTOCLAIM takes leader-a's entries
    assert successor.fence.epoch == crashed.fence.epoch + 1
    successor.step()
    assert {r.ip for r in env.audit() if r.result is Result.RELEASED and r.ip} == leaked
    assert {r.leader for r in env.audit()} == {"leader-b"}
    assert env.pending() == 0
    assert env.writes("leader-a") == []
    assert env.sim.truth.violations == [] and env.sim.truth.leaked_ips() == set()


def test_dry_run_decides_and_records_but_writes_nothing(env: Env) -> None:
    leaked = _dead_node(env)
    spare = env.sim.empty_block("node-a")
    env.decide()
    env.server.clear_requests()
    dry = env.leader("dry", dry_run=True)
    dry.step()
    env.clock.advance(10_000)
    dry.step()
    assert [r for r in env.server.requests if r.method in WRITES] == []
    records = env.audit()
    assert {r.ip for r in records if r.result is Result.DRY_RUN and r.ip} == leaked
    assert all(r.reason == "would release" for r in records if r.ip)
    assert any(r.block == spare and r.result is Result.DRY_RUN for r in records)
    assert env.sim.truth.leaked_ips() == leaked
    assert env.pending(DRY_RUN_GROUP) == 0 and env.pending(GROUP) == 0
    # Its own consumer group: a real leader still gets every decision.
    real = env.leader("real")
    real.step()
    assert {r.ip for r in env.audit() if r.result is Result.RELEASED and r.ip} == leaked
    assert env.sim.truth.violations == [] and env.sim.truth.leaked_ips() == set()
