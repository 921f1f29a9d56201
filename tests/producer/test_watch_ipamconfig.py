"""The watcher follows IPAMConfig `default` (IPAMConfiguration in projectcalico.org/v3) and mirrors its IP
cooldown into `P:state` for the leader: over real HTTP, with real Redis, on a cluster of either API group.
An unreadable value is mirrored as the longest cooldown; an IPAMConfig that cannot be listed leaves the
field absent (the leader then reads the live object) and does not hold back the initial sync."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from lab.apiserver.apiserver import SimApiServer
from lab.apiserver.resources import resources_for
from lab.apiserver.store import Store
from lab.cluster.cluster import SimCluster
from producer.kinds import Kind
from shared.calicogroup import V1, V3, CalicoGroup
from shared.keys import STATE_IP_COOLDOWN
from tests.fixtures.stack import KEYS, caught_up, fast_settings, running_watcher
from tests.polling import wait_until


@pytest.fixture(params=[V1, V3], ids=["v1", "v3"])
def cluster(request: pytest.FixtureRequest) -> Iterator[tuple[SimApiServer, SimCluster, CalicoGroup]]:
    group: CalicoGroup = request.param
    store = Store(resources_for(group), seed=3)
    with SimApiServer(store, bookmark_interval=0.2) as server:
        yield server, SimCluster(store, seed=3), group


def mirrored(client: redis.Redis) -> bytes | None:
    value = client.hget(KEYS.state, STATE_IP_COOLDOWN)
    assert value is None or isinstance(value, bytes)
    return value


def test_the_cooldown_is_mirrored_and_follows_the_cluster(
    cluster: tuple[SimApiServer, SimCluster, CalicoGroup], client: redis.Redis, redis_url: str
) -> None:
    server, sim, group = cluster
    sim.bootstrap("15m0s")  # IPAMConfig `default` without ipCooldownSeconds: no cooldown
    sim.populate(nodes=1, pods_per_node=1)
    with running_watcher(server, fast_settings(redis_url)) as rw:
        w = rw.watcher
        wait_until(lambda: w.synced.is_set() and caught_up(w, server), timeout=10)
        assert mirrored(client) == b"0"
        assert w.stats.get("lists", Kind.IPAM_CONFIG) == 1

        sim.set_ip_cooldown(120)  # as an operator edits it
        wait_until(lambda: mirrored(client) == b"120", timeout=10)

        obj = sim.store.get("ipamconfigs", None, "default")
        assert obj["kind"] == group.kind("ipamconfigs")
        obj["spec"]["ipCooldownSeconds"] = "2m"  # not what the CRD's schema allows
        sim.store.replace("ipamconfigs", None, "default", obj)
        wait_until(lambda: mirrored(client) == b"1200", timeout=10)  # the longest: IPs kept off reuse
        assert w.stats.get("malformed", Kind.IPAM_CONFIG) == 1

        sim.store.delete("ipamconfigs", None, "default")
        wait_until(lambda: mirrored(client) == b"0", timeout=10)  # Calico's defaults

        # A change the watch missed (it ended, and the version is compacted): the relist finds it.
        sim.set_ip_cooldown(30)
        wait_until(lambda: mirrored(client) == b"30", timeout=10)
        server.faults.add(verbs={"watch"}, resources={group.plural("ipamconfigs")}, expire=True, times=1)
        server.drop_watches(group.plural("ipamconfigs"))
        wait_until(lambda: w.stats.get("relists", Kind.IPAM_CONFIG) >= 1, timeout=10)
        sim.set_ip_cooldown(45)
        wait_until(lambda: mirrored(client) == b"45", timeout=10)


def test_an_unlistable_ipam_config_leaves_no_cooldown_and_does_not_hold_the_sync(
    server: SimApiServer, sim: SimCluster, client: redis.Redis, redis_url: str
) -> None:
    sim.bootstrap("15m0s")
    sim.set_ip_cooldown(60)
    sim.populate(nodes=1, pods_per_node=1)
    client.hset(KEYS.state, STATE_IP_COOLDOWN, "999")  # an earlier watcher's value
    denied = server.faults.add(verbs={"list"}, resources={"ipamconfigs"}, error_rate=1.0, error_code=500)
    with running_watcher(server, fast_settings(redis_url)) as rw:
        w = rw.watcher
        wait_until(lambda: w.synced.is_set() and w.stats.get("errors", Kind.IPAM_CONFIG) >= 1, timeout=10)
        assert client.hget(KEYS.state, "synced") == b"1"
        assert mirrored(client) is None  # not the stale 999: the leader reads the live object meanwhile
        server.faults.remove(denied.id)
        wait_until(lambda: mirrored(client) == b"60", timeout=15)
