"""IP cooldown (Calico 3.33): the leader parks what it releases, and returns it only after the cooldown.

The simulated cluster runs on the test's fake clock here (its CNI stamps `releasedAt` and normalizes with
it), so the leader, the CNI and the mirror agree on time.
"""

from __future__ import annotations

from lab.cluster.cluster import SimCluster
from shared.blockops import rfc3339
from shared.netaddr import cidr_to_name
from shared.parse import parse_block
from tests.fixtures.leader import GRACE, Env
from workers.leader.audit import Result

COOLDOWN = 120


def _cluster(env: Env) -> SimCluster:
    env.server.store.remove_hook(env.sim._on_commit)
    sim = SimCluster(env.server.store, seed=7, clock=env.clock.now)
    env.sim = sim
    sim.bootstrap()
    sim.add_node("node-a")
    sim.create_pod("ns", "keep", "node-a")
    sim.create_pod("ns", "gone", "node-a")
    return sim


def _block(env: Env, cidr: str) -> dict[str, object]:
    return env.server.store.get("ipamblocks", None, cidr_to_name(cidr))


def _cold(env: Env) -> dict[str, float]:
    return {k.decode(): float(v) for k, v in env.redis.hgetall(env.keys.coldblocks).items()}


def test_a_released_ip_cools_down_and_is_returned_only_after_its_cooldown(env: Env) -> None:
    sim = _cluster(env)
    sim.set_ip_cooldown(COOLDOWN)
    (leaked,) = sim.leak_pod_deleted_without_cni_del("ns", "gone")
    (cidr,) = sim.cni.node_blocks("node-a", 4)
    env.decide()
    env.clock.advance(GRACE + 1)
    assert env.decide() == 1
    lead = env.leader()
    lead.step()
    assert [r.ip for r in env.audit() if r.result is Result.RELEASED] == [leaked]
    assert sim.truth.violations == [] and sim.truth.leaked_ips() == set()

    # Parked, not freed: a handle-less `releasedAt` attribute, off the free list, never an allocation.
    released_at = env.clock.now()
    spec = _block(env, cidr)["spec"]
    assert isinstance(spec, dict)
    ordinal = [a.ip for a in parse_block(_block(env, cidr)).iter_allocations()]
    assert leaked not in ordinal
    cooling = [
        spec["attributes"][i]
        for i in spec["allocations"]
        if i is not None and "releasedAt" in spec["attributes"][i]
    ]
    assert cooling == [{"releasedAt": rfc3339(released_at)}]
    leaked_ordinal = int(leaked.rsplit(".", 1)[1]) - int(cidr.split("/")[0].rsplit(".", 1)[1])
    assert leaked_ordinal not in spec["unallocated"]

    # The watcher's diff lists the block as cold; the CNI never hands the IP out while it cools.
    env.sync()
    assert _cold(env) == {cidr: float(int(released_at))}
    new_ips = [sim.create_pod("ns", f"new-{i}", "node-a")[0] for i in range(3)]
    assert leaked not in new_ips

    # Within the cooldown the backstop leaves it; after it, it returns it with a conditional write.
    env.clock.advance(COOLDOWN - 1)
    writes = len(env.writes())
    lead.step()
    assert len(env.writes()) == writes
    assert leaked_ordinal not in _block(env, cidr)["spec"]["unallocated"]  # type: ignore[index]
    env.clock.advance(2)
    lead.step()
    spec = _block(env, cidr)["spec"]
    assert isinstance(spec, dict)
    assert spec["unallocated"][-1] == leaked_ordinal
    assert all("releasedAt" not in a for a in spec["attributes"])
    put = env.writes()[writes:]
    assert [(r.method, r.resource) for r in put] == [("PUT", "ipamblocks")]
    env.sync()
    assert _cold(env) == {}
    assert sim.truth.violations == [] and sim.truth.unexpected == []


def test_without_a_cooldown_the_leader_frees_at_once_and_nothing_is_cold(env: Env) -> None:
    sim = _cluster(env)
    (leaked,) = sim.leak_pod_deleted_without_cni_del("ns", "gone")
    (cidr,) = sim.cni.node_blocks("node-a", 4)
    env.decide()
    env.clock.advance(GRACE + 1)
    env.decide()
    env.leader().step()
    spec = _block(env, cidr)["spec"]
    assert isinstance(spec, dict)
    assert all("releasedAt" not in a for a in spec["attributes"])
    assert [r.ip for r in env.audit() if r.result is Result.RELEASED] == [leaked]
    env.sync()
    assert _cold(env) == {}


def test_a_conflicting_cold_block_is_skipped_and_retried(env: Env) -> None:
    sim = _cluster(env)
    sim.set_ip_cooldown(COOLDOWN)
    sim.leak_pod_deleted_without_cni_del("ns", "gone")
    (cidr,) = sim.cni.node_blocks("node-a", 4)
    env.decide()
    env.clock.advance(GRACE + 1)
    env.decide()
    lead = env.leader()
    lead.step()
    env.sync()
    env.clock.advance(COOLDOWN + 1)
    store, api = env.server.store, lead.api
    live_get = api.get
    raced: list[str] = []

    def racing_get(plural: str, name: str) -> dict[str, object]:
        obj = live_get(plural, name)
        if plural == "ipamblocks" and not raced:  # another writer updates the block after our read
            raced.append(name)
            other = store.get("ipamblocks", None, name)
            other["metadata"].setdefault("labels", {})["touched"] = "yes"
            store.replace("ipamblocks", None, name, other)
        return obj

    api.get = racing_get  # type: ignore[method-assign]
    lead.step()  # the conflict is skipped, not an error of the pass
    assert lead.cold.stats.skipped == 1 and lead.cold.stats.written == 0
    lead.step()
    assert lead.cold.stats.written == 1
    spec = _block(env, cidr)["spec"]
    assert isinstance(spec, dict)
    assert all("releasedAt" not in a for a in spec["attributes"])
