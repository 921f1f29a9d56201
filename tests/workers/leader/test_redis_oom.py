"""A Redis at its maxmemory (`noeviction`, as deployed: every write that may grow the data is refused with
`OOM command not allowed`): the leader goes on passing instead of exiting, releases nothing wrongly, and
releases the leaks once room is made; the audit records Redis refused are counted lost and reported as a
gap (`workers/leader/audit_seq.py`)."""

from __future__ import annotations

import threading

from shared import metrics_names as m
from tests.fixtures.leader import Env
from tests.polling import wait_until
from workers.leader.audit import AuditRecord, Result
from workers.leader.audit_seq import find_gaps
from workers.leader.loop import EXIT_STOPPED


def _dead_node(env: Env) -> set[str]:
    sim = env.sim
    sim.add_node("node-a")
    sim.add_node("node-dead")
    sim.create_pod("ns", "p1", "node-dead")
    sim.create_pod("ns", "p2", "node-a")
    env.decide()
    sim.leak_node_deleted("node-dead")
    assert env.decide() > 0
    return sim.truth.leaked_ips()


def test_the_leader_passes_on_through_oom_refusals_and_releases_once_room_is_made(env: Env) -> None:
    leaked = _dead_node(env)
    lead = env.leader(hold_recheck_seconds=0.05)
    lead.trail.record(AuditRecord(Result.REFUSED_VALID, ip="10.9.9.9", reason="a record before"))
    lead.trail.flush()  # seq 1, in the stream: a gap after it would show
    before = env.redis.config_get("maxmemory")["maxmemory"]
    stop = threading.Event()
    exits: list[int] = []
    serving = threading.Thread(target=lambda: exits.append(lead.serve(stop)), daemon=True)
    try:
        env.redis.config_set("maxmemory", 1)  # below what it holds: every write refused
        passes = lead.stats.passes
        serving.start()
        wait_until(lambda: lead.stats.passes >= passes + 3, timeout=10, what="passes through the OOM")
        assert serving.is_alive() and exits == []
        assert env.sim.truth.violations == []
    finally:
        env.redis.config_set("maxmemory", before)

    def released() -> bool:
        return leaked <= {u.ip for u in env.sim.truth.released_leaks()}

    try:
        wait_until(released, timeout=20, what="the leaks released once Redis takes writes again")
    finally:
        stop.set()
        serving.join(timeout=10)
    assert exits == [EXIT_STOPPED]
    assert env.sim.truth.violations == [] and env.sim.truth.unexpected == []
    stream = env.audit()
    assert {r.ip for r in stream if r.result.value == "released" and r.ip} <= leaked
    lost = lead.metrics.registry.get_sample_value(m.AUDIT_RECORDS_LOST + "_total") or 0.0
    gaps = find_gaps(r.seq for r in stream)
    assert sum(g.lost for g in gaps) == lost  # every record Redis refused is a counted, reported gap
