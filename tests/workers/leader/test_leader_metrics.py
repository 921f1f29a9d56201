"""The leader's metrics: every audit record counted by result and object, released IPs added to the
Redis-kept reclamations once per pass, the epoch of its term, and a heartbeat state that follows the Lease."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from kubeio.election import Leadership
from tests.fixtures.leader import Env, leader_settings
from workers.leader.loop import Leader
from workers.leader.metrics import LeaderMetrics


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    v = registry.get_sample_value(name, labels)
    return 0.0 if v is None else v


def test_a_pass_counts_its_outcomes_and_reclamations(env: Env) -> None:
    sim = env.sim
    sim.add_node("node-a")
    sim.add_node("node-dead")
    sim.create_pod("ns", "gone", "node-a")
    sim.create_pod("ns", "keep", "node-a")
    sim.create_pod("ns", "dead-1", "node-dead")
    env.decide()
    registry = CollectorRegistry()
    metrics = LeaderMetrics(registry)
    leadership = Leadership.granted("leader-a")
    metrics.candidate(leadership)
    lead = Leader(
        leader_settings(), env.redis, env.api("leader-a"), leadership, clock=env.clock, metrics=metrics
    )
    lead.start()
    assert value(registry, "ipamgc_leader_epoch") == 1
    assert value(registry, "ipamgc_leader_is_leader") == 1
    assert metrics.health() == (True, "leading")

    gone = sim.leak_pod_deleted_without_cni_del("ns", "gone")
    sim.leak_node_deleted("node-dead")  # its pod IP and its tunnel IP, then its block and affinity
    env.clock.advance(1000)  # past the 900 s grace period of the live node's leak
    env.decide()
    env.clock.advance(1000)
    env.decide()
    lead.step()
    released = [r for r in env.audit() if r.result.value == "released"]
    ips = [r for r in released if r.ip]
    blocks = [r for r in released if not r.ip]
    assert set(gone) <= {r.ip for r in ips} and len(ips) == len(gone) + 2
    assert blocks, "the deleted node's block is released too"
    assert value(registry, "ipamgc_releases_total", result="released", object="ip") == len(ips)
    assert value(registry, "ipamgc_releases_total", result="released", object="block") == len(blocks)
    reclaimed = {f.decode(): int(v) for f, v in env.redis.hgetall(env.keys.reclaimed).items()}
    expected: dict[str, int] = {}
    for r in ips:
        expected[f"{r.block}|{r.node}"] = expected.get(f"{r.block}|{r.node}", 0) + 1
    assert reclaimed == expected

    lead.leadership.lose()
    assert value(registry, "ipamgc_leader_is_leader") == 0
    assert metrics.health() == (True, "standby")


def test_a_stalled_loop_is_not_alive() -> None:
    now = [0.0]
    metrics = LeaderMetrics(monotonic=lambda: now[0])
    metrics.candidate(Leadership.granted("x"))
    assert metrics.health(stall=10) == (True, "leading")
    now[0] = 11.0
    assert metrics.health(stall=10) == (False, "leading")
    metrics.beat()
    assert metrics.health(stall=10)[0]
