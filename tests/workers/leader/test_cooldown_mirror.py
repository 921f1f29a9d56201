"""The leader and the IPAM configuration's cooldown: the cold-IP pass reads the live object on each pass
that has a cooling block and uses it, as Calico's `garbageCollectColdIPs` does; a release uses the longer
of the mirrored (`P:state` `ip_cooldown`) and the live cooldowns, and the live read stays the final guard
(no live read, no write).  On clusters of both API groups (IPAMConfiguration in projectcalico.org/v3)."""

from __future__ import annotations

import pytest

from lab.apiserver.store import Store
from lab.cluster.cluster import SimCluster
from shared.calicogroup import V1
from shared.netaddr import cidr_to_name
from tests.fixtures.leader import GRACE, Env
from workers.leader.audit import Result

COOLDOWN = 120


@pytest.fixture(params=["env", "env_v3"])
def any_env(request: pytest.FixtureRequest) -> Env:
    env: Env = request.getfixturevalue(request.param)
    return env


def _cluster(env: Env, cooldown: int | None) -> SimCluster:
    env.server.store.remove_hook(env.sim._on_commit)
    sim = SimCluster(env.server.store, seed=7, clock=env.clock.now)
    env.sim = sim
    sim.bootstrap()
    if cooldown is not None:
        sim.set_ip_cooldown(cooldown)
    sim.add_node("node-a")
    sim.create_pod("ns", "keep", "node-a")
    sim.create_pod("ns", "gone", "node-a")
    return sim


def _config_reads(env: Env) -> int:
    store: Store = env.server.store
    plural = (store.calico or V1).plural("ipamconfigs")
    return len([r for r in env.server.requests if r.method == "GET" and r.resource == plural])


def _cooling(env: Env, cidr: str) -> list[dict[str, object]]:
    spec = env.server.store.get("ipamblocks", None, cidr_to_name(cidr))["spec"]
    return [
        spec["attributes"][i]
        for i in spec["allocations"]
        if i is not None and "releasedAt" in spec["attributes"][i]
    ]


def _release_the_leak(env: Env, sim: SimCluster) -> tuple[str, str]:
    (leaked,) = sim.leak_pod_deleted_without_cni_del("ns", "gone")
    (cidr,) = sim.cni.node_blocks("node-a", 4)
    env.decide()
    env.clock.advance(GRACE + 1)
    assert env.decide() == 1
    return leaked, cidr


def test_the_cold_pass_reads_the_live_config_whatever_the_mirror_says(any_env: Env) -> None:
    """Calico's `garbageCollectColdIPs` reads the IPAM config on each pass that has a cooling block and
    uses it: a stale, higher cooldown in the mirror keeps no IP parked longer (ipamgc used to skip the
    pass while nothing was due under the mirrored value, and to write with the longer of the two)."""
    env = any_env
    sim = _cluster(env, COOLDOWN)
    env.mirror.set_ip_cooldown(COOLDOWN)
    leaked, cidr = _release_the_leak(env, sim)
    lead = env.leader()
    lead.step()
    assert [r.ip for r in env.audit() if r.result is Result.RELEASED] == [leaked]
    assert len(_cooling(env, cidr)) == 1
    env.sync()  # the watcher's diff lists the block as cold
    env.mirror.set_ip_cooldown(10 * COOLDOWN)  # a mirror that missed the cooldown going back down

    reads = _config_reads(env)
    env.clock.advance(COOLDOWN - 2)
    lead.step()  # a block cools: one live read, nothing due yet under the live cooldown
    assert _config_reads(env) == reads + 1 and lead.cold.stats.written == 0
    env.clock.advance(3)
    lead.step()  # due under the live cooldown: returned with a conditional write
    assert _config_reads(env) == reads + 2
    assert lead.cold.stats.written == 1 and _cooling(env, cidr) == []
    env.sync()
    lead.step()  # nothing cools any more: no read
    assert _config_reads(env) == reads + 2
    assert sim.truth.violations == []


def test_without_a_mirrored_cooldown_every_cold_pass_reads_the_live_config(env: Env) -> None:
    sim = _cluster(env, COOLDOWN)
    env.mirror.set_ip_cooldown(None)  # the watcher has not listed IPAMConfigs (yet)
    _, cidr = _release_the_leak(env, sim)
    lead = env.leader()
    lead.step()
    env.sync()
    reads = _config_reads(env)
    env.clock.advance(1)
    lead.step()
    env.clock.advance(1)
    lead.step()
    assert _config_reads(env) == reads + 2  # Calico's behaviour: read once per pass
    assert lead.cold.stats.written == 0 and len(_cooling(env, cidr)) == 1


@pytest.mark.parametrize(
    ("live", "watched", "parked"),
    [
        (0, COOLDOWN, True),  # raised an instant ago where the watcher saw it first: not shortened
        (COOLDOWN, 0, True),  # the live read is the final guard
        (COOLDOWN, None, True),
        (0, 0, False),
        (0, None, False),
    ],
)
def test_a_release_parks_for_the_longer_of_the_live_and_mirrored_cooldowns(
    env: Env, live: int, watched: int | None, parked: bool
) -> None:
    sim = _cluster(env, live)
    env.mirror.set_ip_cooldown(watched)
    leaked, cidr = _release_the_leak(env, sim)
    env.leader().step()
    assert [r.ip for r in env.audit() if r.result is Result.RELEASED] == [leaked]
    assert len(_cooling(env, cidr)) == (1 if parked else 0)
    assert sim.truth.violations == []


def test_no_live_config_no_release_whatever_the_mirror_says(env: Env) -> None:
    sim = _cluster(env, 0)
    env.mirror.set_ip_cooldown(0)
    leaked, cidr = _release_the_leak(env, sim)
    down = env.server.faults.add(verbs={"get"}, resources={"ipamconfigs"}, error_rate=1.0, error_code=503)
    lead = env.leader()
    lead.step()
    assert [r.result for r in env.audit()] == [Result.ERROR]
    assert "IPAM config not readable" in env.audit()[0].reason
    assert env.writes() == [] and leaked in sim.truth.leaked_ips()
    env.server.faults.remove(down.id)
    env.clock.advance(60)
    env.decide()
    lead.step()
    assert leaked in [r.ip for r in env.audit() if r.result is Result.RELEASED]
    assert sim.truth.leaked_ips() == set() and _cooling(env, cidr) == []
