"""KubeVirt through the view production builds: the watcher's mirror of VMs and VMIs → the shard job's
view (`workers.redis_state.ShardReader.kubevirt`) → the VM rule (spec §3.8), on a real Redis.

No hand-made `KubeVirtView` here: the VMs and VMIs are fed to `Mirror.kubevirt` as the watcher's publisher
feeds them, the shard job reads them back, and the verdicts are read from what it wrote (candidate timers,
due times, decisions).
"""

from __future__ import annotations

import pytest
import redis

from producer.kinds import Kind as KubeKind
from producer.mirror import Mirror
from producer.relist import Kind
from shared.allocrules import VM_RECREATION_GRACE_SECONDS
from shared.clock import FakeClock
from shared.keys import STATE_KUBEVIRT, Keys
from shared.kubevirt import VirtualMachine, VirtualMachineInstance
from shared.shard import shard_of
from tests.fixtures.redis import Cluster, decisions, dirty_ids
from tests.workers.shards.validate_helpers import candidate, due, run
from workers.shards.writes import DUE_EPSILON_SECONDS

NS = "vms"


def vm_ip(cluster: Cluster, vm: str, node: str, *, standalone: bool = False) -> str:
    """The CNI's allocation for a KubeVirt VM (Calico ≥ 3.32): handle `k8s-pod-network.vmi.<ns>.<vm>`."""
    attrs = {
        "namespace": NS,
        "node": node,
        "pod": f"virt-launcher-{vm}-abcde",
        "vmi-name": vm,
        "vmi-uid": "u",
    }
    if not standalone:
        attrs["vm-uid"] = "v"
    handle = f"k8s-pod-network.vmi.{NS}.{vm}"
    ip = cluster.builder.ipam.assign(node, handle, attrs, version=4)
    return f"{handle}/{ip}"


def vm(name: str) -> VirtualMachine:
    return VirtualMachine(NS, name)


def vmi(name: str, owned: bool = True) -> VirtualMachineInstance:
    return VirtualMachineInstance(NS, name, owned_by_vm=owned)


def start(mirror: Mirror, cluster: Cluster, grace: float | None) -> None:
    mirror.set_config(grace, True)
    mirror.relist(Kind.NODES, cluster.nodes())
    mirror.relist(Kind.PODS, cluster.pods())
    mirror.relist(Kind.BLOCKS, cluster.blocks())
    mirror.mark_synced()


def list_kubevirt(mirror: Mirror, vms: list[VirtualMachine], vmis: list[VirtualMachineInstance]) -> None:
    mirror.kubevirt.relist(KubeKind.VMS, vms, frozenset())
    mirror.kubevirt.relist(KubeKind.VMIS, vmis, frozenset())


def test_the_vm_rule_applies_only_once_vms_and_vmis_are_both_listed(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, clock: FakeClock
) -> None:
    cluster.builder.add_node("node-1")
    gone = vm_ip(cluster, "gone", "node-1")
    start(mirror, cluster, 60.0)
    run(client, keys, clock)
    assert candidate(client, keys, "node-1", gone) is None  # KubeVirt not listed: kubevirt-absent, valid

    mirror.kubevirt.relist(KubeKind.VMS, [], frozenset())
    assert client.hget(keys.state, STATE_KUBEVIRT) is None
    assert gone not in dirty_ids(client, keys)
    run(client, keys, clock)
    assert candidate(client, keys, "node-1", gone) is None  # VMIs not listed yet: still off

    t0 = clock.now()
    mirror.kubevirt.relist(KubeKind.VMIS, [], frozenset())
    assert client.hget(keys.state, STATE_KUBEVIRT) == b"1"
    assert gone in dirty_ids(client, keys)  # switching the rule on re-validates every VM allocation
    run(client, keys, clock)
    c = candidate(client, keys, "node-1", gone)
    assert c is not None and c.first_seen == t0
    # A VM candidate on a live node waits max(5 min, grace): here 5 minutes, not the 60 s grace period.
    assert due(client, keys, "node-1", gone) == pytest.approx(
        t0 + VM_RECREATION_GRACE_SECONDS + DUE_EPSILON_SECONDS
    )


@pytest.mark.parametrize("grace", [None, 0.0, 60.0, 1200.0])
def test_a_live_node_vm_candidate_waits_max_of_five_minutes_and_grace(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, clock: FakeClock, grace: float | None
) -> None:
    cluster.builder.add_node("node-1")
    leaked = vm_ip(cluster, "deleted", "node-1")
    start(mirror, cluster, grace)
    list_kubevirt(mirror, [], [])
    wait = max(VM_RECREATION_GRACE_SECONDS, grace or 0.0)  # also when the grace period is 0 or unset
    run(client, keys, clock)
    assert decisions(client, keys) == []
    clock.advance(wait)
    mirror.kick()
    run(client, keys, clock)
    assert decisions(client, keys) == []  # confirmation is strictly after the wait
    clock.advance(1.0)
    mirror.kick()
    run(client, keys, clock)
    [d] = decisions(client, keys)
    assert (d.alloc_id, d.reason, d.type) == (leaked, "vm-missing", "vm")


def test_vm_and_vmi_presence_decide_as_calico(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, clock: FakeClock
) -> None:
    cluster.builder.add_node("node-1")
    cluster.builder.add_node("node-2")
    running = vm_ip(cluster, "running", "node-2")  # VM present
    bare = vm_ip(cluster, "bare", "node-2", standalone=True)  # standalone VMI, no VM
    orphan = vm_ip(cluster, "orphan", "node-2")  # a VMI owned by a VM that is gone
    missing = vm_ip(cluster, "missing", "node-2")  # neither
    start(mirror, cluster, 60.0)
    list_kubevirt(
        mirror, [vm("running")], [vmi("running"), vmi("bare", owned=False), vmi("orphan", owned=True)]
    )
    # node-2 is lost: its invalid allocations are confirmed at once, the valid ones keep it.
    cluster.builder.delete_node("node-2")
    mirror.delete_node("node-2")
    run(client, keys, clock)
    decided = {d.alloc_id: d.reason for d in decisions(client, keys)}
    assert decided == {orphan: "vm-missing", missing: "vm-missing"}
    assert running not in decided and bare not in decided


def test_a_vm_or_vmi_event_dirties_exactly_the_vm_allocations_it_names(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, clock: FakeClock
) -> None:
    cluster.builder.add_node("node-1")
    a = vm_ip(cluster, "a", "node-1")
    b = vm_ip(cluster, "b", "node-1")
    start(mirror, cluster, 60.0)
    list_kubevirt(mirror, [vm("a"), vm("b")], [vmi("a"), vmi("b")])
    run(client, keys, clock)
    assert dirty_ids(client, keys) == set()

    mirror.kubevirt.apply(KubeKind.VMS, [vm("a")])  # an update that changes nothing the rule reads
    mirror.kubevirt.apply(KubeKind.VMIS, [vmi("b")])
    assert dirty_ids(client, keys) == set()

    mirror.kubevirt.delete(KubeKind.VMS, ["vms/a"])
    assert dirty_ids(client, keys) == {a}
    run(client, keys, clock)
    assert candidate(client, keys, "node-1", a) is not None  # its VMI is owned by the deleted VM
    assert candidate(client, keys, "node-1", b) is None

    mirror.kubevirt.apply(KubeKind.VMIS, [vmi("a", owned=False)])  # the owner reference went: standalone
    assert dirty_ids(client, keys) == {a}
    run(client, keys, clock)
    assert candidate(client, keys, "node-1", a) is None

    mirror.kubevirt.delete(KubeKind.VMIS, ["vms/b", "vms/nobody"])
    assert dirty_ids(client, keys) == set()  # b's VM is still there: its VMI does not matter; nobody: unknown
    mirror.kubevirt.delete(KubeKind.VMS, ["vms/b"])
    assert dirty_ids(client, keys) == {b}


def test_a_relist_deletes_and_dirties_what_a_missed_watch_would_have(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, clock: FakeClock
) -> None:
    cluster.builder.add_node("node-1")
    a = vm_ip(cluster, "a", "node-1")
    vm_ip(cluster, "b", "node-1")
    start(mirror, cluster, 60.0)
    list_kubevirt(mirror, [vm("a"), vm("b")], [])
    run(client, keys, clock)
    mirror.kubevirt.relist(KubeKind.VMS, [vm("b")], frozenset())
    assert dirty_ids(client, keys) == {a}
    assert client.hkeys(keys.vms) == [b"vms/b"]
    mirror.kubevirt.relist(KubeKind.VMS, [], None)  # an unidentifiable object was listed: delete nothing
    assert client.hkeys(keys.vms) == [b"vms/b"]


def test_a_restarted_watcher_dirties_vm_allocations_from_its_reloaded_memory(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, clock: FakeClock
) -> None:
    cluster.builder.add_node("node-1")
    a = vm_ip(cluster, "a", "node-1")
    start(mirror, cluster, 60.0)
    list_kubevirt(mirror, [vm("a")], [vmi("a")])
    run(client, keys, clock)
    again = Mirror(client, keys, clock=clock)  # memory loaded from Redis: blocks, VMs and VMIs
    again.kubevirt.reset()
    assert client.hget(keys.state, STATE_KUBEVIRT) is None  # off until this process has listed
    list_kubevirt(again, [], [vmi("a")])
    assert a in dirty_ids(client, keys)
    run(client, keys, clock)
    assert candidate(client, keys, "node-1", a) is not None


def test_kubevirt_going_away_turns_the_rule_off_and_keeps_every_vm_ip(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, clock: FakeClock
) -> None:
    cluster.builder.add_node("node-1")
    a = vm_ip(cluster, "a", "node-1")
    start(mirror, cluster, 60.0)
    list_kubevirt(mirror, [], [])
    run(client, keys, clock)
    assert candidate(client, keys, "node-1", a) is not None
    mirror.kubevirt.set_installed(False)
    assert client.hget(keys.state, STATE_KUBEVIRT) is None
    assert not client.exists(keys.vms, keys.vmis)
    assert a in dirty_ids(client, keys)
    run(client, keys, clock)
    assert candidate(client, keys, "node-1", a) is None  # kubevirt-absent: valid, its timer cleared


def test_an_unreadable_vm_record_keeps_the_ip_and_is_counted(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster, clock: FakeClock
) -> None:
    cluster.builder.add_node("node-1")
    a = vm_ip(cluster, "a", "node-1")
    start(mirror, cluster, 60.0)
    list_kubevirt(mirror, [], [])
    client.hset(keys.vms, "vms/a", b"\xc1junk")
    client.sadd(keys.dirty(shard_of("node-1")), a)
    stats = run(client, keys, clock)
    assert stats.unknown_lookups == 1
    assert candidate(client, keys, "node-1", a) is None  # vm-unknown: valid
