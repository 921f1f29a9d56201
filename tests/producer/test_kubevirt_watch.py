"""The watcher and KubeVirt over real HTTP: kubevirt.io/v1 noticed when installed later, VMs and VMIs listed
and watched as slim records, the VM rule switched on once both are mirrored, each VM or VMI event dirtying
exactly the VM allocations it names, and KubeVirt's removal switching the rule off again."""

from __future__ import annotations

import redis

from lab.apiserver.apiserver import SimApiServer
from lab.apiserver.resources import KUBEVIRT_RESOURCES
from lab.cluster.cluster import SimCluster
from lab.cluster.kubevirt import KubeVirt
from producer.kinds import Kind
from producer.watcher import Watcher
from shared.keys import STATE_KUBEVIRT
from tests.fixtures.stack import (
    KEYS,
    allocation_ids,
    caught_up,
    clear_dirty,
    dirty_ids,
    fast_settings,
    running_watcher,
)
from tests.polling import wait_until


def _caught_up(w: Watcher, server: SimApiServer) -> bool:
    rv = server.store.resource_version
    kinds = (Kind.VMS, Kind.VMIS)
    return caught_up(w, server) and all(int(w.applied_rv.get(k) or 0) >= rv for k in kinds)


def _flag(client: redis.Redis) -> bytes | None:
    value = client.hget(KEYS.state, STATE_KUBEVIRT)
    return value if isinstance(value, bytes) else None


def test_kubevirt_installed_later_is_watched_and_its_events_dirty_the_vm_allocations_they_name(
    server: SimApiServer, sim: SimCluster, client: redis.Redis, redis_url: str
) -> None:
    sim.bootstrap("15m0s")
    sim.populate(nodes=2, pods_per_node=1)
    settings = fast_settings(redis_url, kubevirt_discovery_seconds=0.2)
    with running_watcher(server, settings) as rw:
        w = rw.watcher
        wait_until(lambda: w.synced.is_set() and caught_up(w, server), timeout=10)
        assert _flag(client) is None  # not served: the VM rule is off

        server.store.serve(KUBEVIRT_RESOURCES)  # KubeVirt installed while the watcher runs
        kv = KubeVirt(sim)
        kv.create_vm("vms", "db", "node-00000")
        kv.create_vm("vms", "bare", "node-00001", standalone=True)
        wait_until(lambda: _flag(client) == b"1", timeout=10, what="the VM rule on")
        wait_until(lambda: _caught_up(w, server), timeout=10)
        assert {f.decode() for f in client.hkeys(KEYS.vms)} == {"vms/db"}
        assert {f.decode() for f in client.hkeys(KEYS.vmis)} == {"vms/db", "vms/bare"}
        db = allocation_ids(sim, ips=set(kv.vms[("vms", "db")].ips))
        bare = allocation_ids(sim, ips=set(kv.vms[("vms", "bare")].ips))
        assert db | bare <= dirty_ids(client)  # switching the rule on re-validates every VM allocation

        def after(expected: set[str]) -> None:
            wait_until(lambda: _caught_up(w, server) and dirty_ids(client) == expected, timeout=10)
            assert dirty_ids(client) == expected
            clear_dirty(client)

        clear_dirty(client)
        # The VM object deleted (its VMI, owned by it, stays for now): the VM's allocation only.
        server.store.delete("virtualmachines", "vms", "db")
        after(db)
        # A VMI update that changes nothing the rule reads: nothing.
        vmi = server.store.get("virtualmachineinstances", "vms", "bare")
        vmi["metadata"].setdefault("labels", {})["touched"] = "1"
        server.store.replace("virtualmachineinstances", "vms", "bare", vmi)
        wait_until(lambda: _caught_up(w, server), timeout=10)
        assert dirty_ids(client) == set()
        # The standalone VMI deleted: its VM allocation.
        server.store.delete("virtualmachineinstances", "vms", "bare")
        after(bare)
        assert {f.decode() for f in client.hkeys(KEYS.vmis)} == {"vms/db"}

        # KubeVirt uninstalled: the rule off, the VMs and VMIs unmirrored, the VM allocations re-validated.
        server.store.unserve(("virtualmachines", "virtualmachineinstances"))
        wait_until(lambda: _flag(client) is None and not client.exists(KEYS.vms, KEYS.vmis), timeout=10)
        wait_until(lambda: db | bare <= dirty_ids(client), timeout=10)
        assert rw.exit_code is None and w.stats.get("kubevirt_discoveries") >= 2
