"""A change of the leak grace period restarts every leak timer, as Calico's restart does.

kube-controllers exits and restarts on any change of its running configuration ("configuration changed;
restarting", `kubecontrollers/run.go`), and every timer it keeps in memory starts again: leak candidates,
confirmed leaks and empty blocks.  ipamgc keeps its timers in Redis; when the grace period it reads
changes, the watcher stamps the change (`P:state` `leak_grace_since`) and every timer started before it
counts from it: the workers' candidate timers, the decisions waiting in the leader, the leader's
empty-block timers.  Lowering the grace from 1 h to 15 min therefore frees a 40-minute-old candidate 15
minutes after the change, not at once.  A change of anything else (here: the datastore's readiness, which
Calico reads from its syncer without restarting) keeps the timers.
"""

from __future__ import annotations

from shared.gcrecords import decode_candidate
from shared.shard import shard_of
from tests.fixtures.leader import Env
from workers.leader.audit import Result

HOUR = 3600.0
QUARTER = 900.0


def _released(env: Env) -> list[str]:
    return [r.ip or r.block for r in env.audit() if r.result is Result.RELEASED]


def test_lowering_the_grace_period_restarts_candidate_and_empty_block_timers(env: Env) -> None:
    sim = env.sim
    env.grace = HOUR
    sim.add_node("node-a")
    sim.create_pod("ns", "web-0", "node-a")
    sim.create_pod("ns", "web-1", "node-a")
    spare = sim.empty_block("node-a")
    env.decide()
    lead = env.leader()
    lead.step()  # the empty block's timer starts
    [ip] = sim.leak_pod_deleted_without_cni_del("ns", "web-0")
    assert env.decide() == 0  # a candidate
    env.clock.advance(40 * 60)
    assert env.decide() == 0
    lead.step()
    assert _released(env) == []

    env.grace = QUARTER  # the operator lowers the grace period
    changed_at = env.clock.now()
    assert env.decide() == 0  # 40 minutes a candidate, but the timer counts from the change
    lead.step()
    assert _released(env) == []  # the empty block's timer too
    s = shard_of("node-a")
    [raw] = env.redis.hgetall(env.keys.cand(s)).values()
    assert decode_candidate(raw).first_seen == changed_at
    env.clock.advance(QUARTER)
    assert env.decide() == 0  # exactly the grace period: not yet
    lead.step()
    assert _released(env) == []
    env.clock.advance(1.0)
    assert env.decide() == 1
    lead.step()
    assert sorted(_released(env)) == sorted([ip, spare])
    assert sim.truth.violations == [] and sim.truth.leaked_ips() == set()


def test_a_decision_made_under_the_old_grace_period_is_dropped_and_decided_again(env: Env) -> None:
    sim = env.sim
    sim.add_node("node-a")
    sim.create_pod("ns", "web-0", "node-a")
    sim.create_pod("ns", "web-1", "node-a")
    env.decide()
    [ip] = sim.leak_pod_deleted_without_cni_del("ns", "web-0")
    env.decide()
    env.clock.advance(QUARTER + 1)
    assert env.decide() == 1  # confirmed and decided; no leader has read it yet

    env.grace = QUARTER / 2  # changed before the leader's pass: Calico would have restarted
    assert env.decide() == 0
    lead = env.leader()
    lead.step()
    [rec] = env.audit()
    assert (rec.result, rec.ip) == (Result.REFUSED_CONFLICT, ip)
    assert "grace period" in rec.reason
    assert env.pending() == 0
    env.clock.advance(QUARTER / 2)
    assert env.decide() == 0
    env.clock.advance(1.0)
    assert env.decide() == 1
    lead.step()
    assert _released(env) == [ip]
    assert sim.truth.violations == [] and sim.truth.leaked_ips() == set()


def test_a_change_of_the_datastore_readiness_keeps_the_leak_timers(env: Env) -> None:
    sim = env.sim
    sim.add_node("node-a")
    sim.create_pod("ns", "web-0", "node-a")
    sim.create_pod("ns", "web-1", "node-a")
    env.decide()
    [ip] = sim.leak_pod_deleted_without_cni_del("ns", "web-0")
    env.decide()
    started = env.clock.now()
    env.clock.advance(QUARTER / 2)
    env.mirror.set_config(env.grace, False)
    env.mirror.set_config(env.grace, True)
    env.clock.advance(QUARTER / 2 + 1)
    assert env.decide() == 1
    s = shard_of("node-a")
    [raw] = env.redis.hgetall(env.keys.cand(s)).values()
    assert decode_candidate(raw).first_seen == started
    env.leader().step()
    assert _released(env) == [ip]
