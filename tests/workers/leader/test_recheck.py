"""The leader's final re-check when the API cannot answer (spec §3.9): decided as Calico does.

Calico's `allocationIsValid` treats a failed pod lookup (anything but a 404) as *valid*, and `markValid`
restarts the allocation's leak timer: the leak is released one full grace period after the API answers
again, never on the strength of a look that failed.
"""

from __future__ import annotations

from lab.cluster.objects import pod_object, put_pod
from shared.gcrecords import decode_candidate
from shared.keys import REDECIDE_AFTER_SECONDS
from shared.shard import shard_of
from tests.fixtures.leader import GRACE, Env, decided_leak
from workers.leader.audit import Result


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


def test_a_recheck_that_finds_the_ip_valid_starts_a_fresh_grace_period(env: Env) -> None:
    """Calico's `garbageCollectKnownLeaks` calls `markValid` on an IP its final re-check finds valid: the
    IP must then be invalid for a whole grace period again before it is released.  Not a re-send of the
    old decision once the worker's decided mark is `REDECIDE_AFTER_SECONDS` old."""
    ip, alloc_id, s = decided_leak(env)
    store = env.server.store
    # The pod is back with its IP before the leader's pass (the mirror has not seen it).
    put_pod(store, pod_object("ns", "web-0", "node-a", [ip]))
    lead = env.leader()
    lead.step()
    [rec] = env.audit()
    assert (rec.result, rec.ip, rec.reason) == (Result.REFUSED_VALID, ip, "pod-running")
    assert env.redis.hget(env.keys.cand(s), alloc_id) is None  # the leak timer restarted
    assert env.redis.hget(env.keys.decided(s), alloc_id) is None
    refused_at = env.clock.now()

    # The pod goes again; well after the worker's re-decide period, a full resync looks at every IP.
    store.delete("pods", "ns", "web-0", grace_period_seconds=0)
    env.clock.advance(REDECIDE_AFTER_SECONDS + 1)
    env.sync()
    env.mirror.mark_all_dirty()
    assert env.validate() == 0  # a candidate again, from now: not the old decision re-sent
    restarted = decode_candidate(env.redis.hget(env.keys.cand(s), alloc_id) or b"")
    assert restarted.first_seen == refused_at + REDECIDE_AFTER_SECONDS + 1
    env.clock.advance(GRACE)
    env.mirror.mark_all_dirty()
    assert env.validate() == 0
    lead.step()
    assert [r.result for r in env.audit()] == [Result.REFUSED_VALID]
    env.clock.advance(1.0)
    assert env.validate() == 1
    lead.step()
    assert [(r.result, r.ip) for r in env.audit()][-1] == (Result.RELEASED, ip)
    assert env.sim.truth.violations == []
