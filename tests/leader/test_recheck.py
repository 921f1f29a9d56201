"""The leader's final re-check when the API cannot answer (spec §3.9): decided as Calico does.

Calico's `allocationIsValid` treats a failed pod lookup (anything but a 404) as *valid*, and `markValid`
restarts the allocation's leak timer: the leak is released one full grace period after the API answers
again, never on the strength of a look that failed.
"""

from __future__ import annotations

from shared.gcrecords import decode_candidate
from shared.shard import shard_of
from tests.leader.conftest import GRACE, Env
from workers.audit import Result


def test_a_recheck_the_api_cannot_answer_keeps_the_ip_and_restarts_its_leak_timer(env: Env) -> None:
    sim = env.sim
    sim.add_node("node-a")
    [ip] = sim.create_pod("ns", "web-0", "node-a")
    env.decide()
    lead = env.leader()
    sim.leak_pod_deleted_without_cni_del("ns", "web-0")
    env.decide()
    env.clock.advance(GRACE + 1)
    assert env.decide() == 1
    env.server.faults.add(verbs={"get"}, resources={"pods"}, error_rate=1.0, error_code=500)
    lead.step()
    [rec] = env.audit()
    assert (rec.result, rec.ip) == (Result.REFUSED_VALID, ip)
    assert "pod lookup failed" in rec.reason and "timer restarted" in rec.reason
    assert env.pending() == 0  # settled, not retried with the old timer running
    s = shard_of("node-a")
    [alloc_id] = [k.decode() for k in env.redis.zrange(env.keys.due(s), 0, -1)]
    assert env.redis.hget(env.keys.cand(s), alloc_id) is None
    assert env.redis.hget(env.keys.decided(s), alloc_id) is None
    env.server.faults.clear()

    failed_at = env.clock.now()
    env.clock.advance(5.0)
    assert env.validate() == 0  # due again: invalid, a new candidate from now
    restarted = decode_candidate(env.redis.hget(env.keys.cand(s), alloc_id) or b"")
    assert restarted.first_seen == failed_at + 5.0
    env.clock.advance(GRACE)
    assert env.validate() == 0
    lead.step()
    assert [r.result for r in env.audit()] == [Result.REFUSED_VALID]
    env.clock.advance(1.0)
    env.sync()
    assert env.validate() == 1
    lead.step()
    assert [(r.result, r.ip) for r in env.audit()][-1] == (Result.RELEASED, ip)
    assert sim.truth.violations == [] and sim.truth.leaked_ips() == set()
