"""The handle collector against the CNI: a handle a CNI is writing is never touched, a write under the
repair wins (409), a KubeVirt VM's handle gets back the count its IP persistence reads, and CNI churn
racing the leader ends with no IP freed or moved and every handle in step (docs/handles.md)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from lab.apiserver.resources import KUBEVIRT_RESOURCES
from lab.cluster.kubevirt import KubeVirt
from shared import blockops
from shared.netaddr import cidr_to_name
from tests.fixtures.leader import GRACE, Env
from tests.workers.leader.handle_gc_helpers import (
    SCAN,
    drop_handle,
    gc_leader,
    gc_leader_on,
    handle_obj,
    handle_records,
    leader_writes,
    orphan,
    passes,
    repaired,
    set_counts,
)
from workers.leader.audit import Result

NODE = "node-a"


class _CniFirst:
    """The leader's API, with a CNI writing the handle just before the leader's first handle write."""

    def __init__(self, api: Any, before: Callable[[], None]) -> None:
        self.api = api
        self.before = before
        self.fired = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.api, name)

    def _first(self, plural: str) -> None:
        if plural == "ipamhandles" and not self.fired:
            self.fired = True
            self.before()

    def replace(self, plural: str, body: dict[str, Any]) -> dict[str, Any]:
        self._first(plural)
        out: dict[str, Any] = self.api.replace(plural, body)
        return out

    def create(self, plural: str, body: dict[str, Any]) -> dict[str, Any]:
        self._first(plural)
        out: dict[str, Any] = self.api.create(plural, body)
        return out

    def delete(self, plural: str, name: str, uid: str, resource_version: str) -> None:
        self._first(plural)
        self.api.delete(plural, name, uid, resource_version)


def test_a_cni_between_its_handle_write_and_its_block_write_is_never_touched(env: Env) -> None:
    sim = env.sim
    sim.add_node(NODE)
    sim.create_pod("ns", "web-0", NODE)
    [cidr] = sim.cni.node_blocks(NODE, 4)
    handle = "k8s-pod-network.in-flight"
    sim.cni.handles.change(handle, cidr, +1)  # the CNI's first write: the handle, ahead of its block
    lead = gc_leader(env)
    passes(env, lead, 14, every=SCAN)  # 14 scans in 14 minutes: within Calico's 15-minute grace
    assert leader_writes(env) == []
    name = cidr_to_name(cidr)
    block = env.server.store.get("ipamblocks", None, name)  # the CNI's second write: the block
    blockops.assign_in_place(block["spec"], handle, {"node": NODE, "namespace": "ns", "pod": "web-1"})
    env.server.store.replace("ipamblocks", None, name, block)
    passes(env, lead, 6)  # hours of scans after it: handle and block agree, nothing to do
    assert leader_writes(env) == []
    assert env.consistent() == []


def _assign(env: Env, handle: str) -> Callable[[], None]:
    """A CNI ADD for `handle` (a kubelet retry, a VM's launcher pod): handle written, then block."""
    return lambda: env.sim.cni.assign(NODE, handle, {"node": NODE, "namespace": "ns", "pod": "web-0"})


@pytest.mark.parametrize("case", ["skewed", "missing", "orphan"])
def test_a_cni_writing_the_handle_under_the_repair_wins(env: Env, case: str) -> None:
    sim = env.sim
    sim.add_node(NODE)
    [ip] = sim.create_pod("ns", "web-0", NODE)
    handle, _ = sim.pod_handles[("ns", "web-0")]
    [cidr] = handle_obj(env, handle)["spec"]["block"]
    if case == "skewed":
        set_counts(env, handle, {cidr: 2})
    elif case == "missing":
        drop_handle(env, handle)
    else:
        handle = "k8s-pod-network.retried"
        orphan(env, handle, {})
    api = _CniFirst(env.api("leader-a"), _assign(env, handle))
    lead = gc_leader_on(env, api)
    passes(env, lead, 3)
    assert api.fired
    [rec] = handle_records(env)
    assert rec.result is Result.REFUSED_CONFLICT and "409" in rec.reason
    assert [status for _, _, status in leader_writes(env)] == [409]
    assert lead.metrics.handle_gc.refused.labels(case, "conflict")._value.get() == 1
    # The CNI's write stands; the handle is judged afresh, and what still disagrees is repaired later.
    passes(env, lead, 4)
    assert env.consistent() == []
    assert ip in sim.truth.in_use_ips() and sim.truth.violations == []
    assert all(resource == "ipamhandles" for _, resource, _ in leader_writes(env))


def test_a_kubevirt_vms_handle_is_recreated_and_its_ip_survives_a_restart(env: Env) -> None:
    env.server.store.serve(KUBEVIRT_RESOURCES)
    sim = env.sim
    sim.add_node(NODE)
    kv = KubeVirt(sim)
    vm = kv.create_vm("vms", "db", NODE)
    [ip] = vm.ips
    drop_handle(env, vm.handle)  # IPsByHandle finds nothing: a restart would get a new IP
    assert sim.cni.ips_by_handle(vm.handle) == []
    lead = gc_leader(env)
    passes(env, lead, 3)
    assert repaired(env) == [(vm.handle, "missing", "create")]
    assert sim.cni.ips_by_handle(vm.handle) == [ip]
    assert kv.restart_vm("vms", "db").ips == [ip]  # the VM keeps its IP (it asserts so itself)
    assert env.consistent() == [] and sim.truth.violations == []


def test_a_kubevirt_vms_skewed_count_is_set_and_never_frees_its_ip(env: Env) -> None:
    env.server.store.serve(KUBEVIRT_RESOURCES)
    sim = env.sim
    sim.add_node(NODE)
    kv = KubeVirt(sim)
    vm = kv.create_vm("vms", "db", NODE)
    [cidr] = handle_obj(env, vm.handle)["spec"]["block"]
    set_counts(env, vm.handle, {cidr: 2})
    lead = gc_leader(env)
    passes(env, lead, 3)
    assert repaired(env) == [(vm.handle, "skewed", "set-counts")]
    assert handle_obj(env, vm.handle)["spec"]["block"] == {cidr: 1}
    assert leader_writes(env) == [("PUT", "ipamhandles", 200)]  # no block written: the IP stays
    assert kv.restart_vm("vms", "db").ips == vm.ips


def test_cni_churn_racing_the_leader_frees_no_ip_and_ends_in_step(env: Env) -> None:
    sim = env.sim
    sim.add_node(NODE)
    for i in range(6):
        sim.create_pod("ns", f"keep-{i}", NODE)
    [cidr] = sim.cni.node_blocks(NODE, 4)
    orphan(env, "k8s-pod-network.dead", {cidr: 1})
    drop_handle(env, sim.pod_handles[("ns", "keep-0")][0])
    stop = threading.Event()

    def churn() -> int:
        i = 0
        while not stop.is_set():
            sim.create_pod("ns", f"churn-{i}", NODE)
            if i >= 3:
                sim.delete_pod("ns", f"churn-{i - 3}")
            i += 1
        return i

    lead = gc_leader(env)
    with ThreadPoolExecutor(1, thread_name_prefix="cni-churn") as pool:
        churned = pool.submit(churn)
        try:
            passes(env, lead, 12)
        finally:
            stop.set()
        assert churned.result(timeout=30) > 0  # a failure in the CNI thread is raised here
    passes(env, lead, 8)
    assert ("k8s-pod-network.dead", "orphan", "delete") in repaired(env)
    assert any(cls == "missing" for _, cls, _ in repaired(env))
    assert all(resource == "ipamhandles" for _, resource, _ in leader_writes(env))
    assert sim.truth.violations == []
    assert env.consistent() == []


class _BlockWrittenFirst:
    """The leader's API, with a release's block write (its handle not yet decremented) landing just
    before the leader's live re-read of the blocks."""

    def __init__(self, api: Any, before: Callable[[], None]) -> None:
        self.api = api
        self.before = before
        self.fired = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.api, name)

    def get(self, plural: str, name: str) -> dict[str, Any]:
        if plural == "ipamblocks" and not self.fired:
            self.fired = True
            self.before()
        out: dict[str, Any] = self.api.get(plural, name)
        return out


def test_blocks_changed_since_the_last_scan_refuse_the_repair_though_the_handle_did_not(env: Env) -> None:
    sim = env.sim
    sim.add_node(NODE)
    sim.create_pod("ns", "web-0", NODE)
    handle, _ = sim.pod_handles[("ns", "web-0")]
    second = sim.cni.assign(NODE, handle, {"node": NODE, "namespace": "ns", "pod": "web-0"})
    [cidr] = handle_obj(env, handle)["spec"]["block"]
    set_counts(env, handle, {cidr: 3})  # skewed: the blocks hold 2

    def release_block_half() -> None:
        name = cidr_to_name(cidr)
        block = env.server.store.get("ipamblocks", None, name)
        spec = block["spec"]
        [ordinal] = [o for o in range(len(spec["allocations"])) if blockops.ip_of(spec, o) == second]
        spec["allocations"][ordinal] = None
        spec["unallocated"].append(ordinal)
        env.server.store.replace("ipamblocks", None, name, block)

    api = _BlockWrittenFirst(env.api("leader-a"), release_block_half)
    lead = gc_leader_on(env, api)
    passes(env, lead, 3)
    assert api.fired
    [rec] = handle_records(env)
    assert rec.result is Result.REFUSED_CONFLICT and "changed since first seen" in rec.reason
    assert rec.evidence["handle_gc"]["live"]["held"] == {cidr: 1}
    assert leader_writes(env) == []  # the handle's resourceVersion alone would have let it through
    assert handle_obj(env, handle)["spec"]["block"] == {cidr: 3}


def test_releases_take_the_rate_limits_tokens_before_handle_repairs(env: Env) -> None:
    sim = env.sim
    sim.add_node(NODE)
    sim.create_pod("ns", "web-0", NODE)
    sim.create_pod("ns", "web-1", NODE)
    skewed, _ = sim.pod_handles[("ns", "web-1")]
    [cidr] = handle_obj(env, skewed)["spec"]["block"]
    set_counts(env, skewed, {cidr: 2})
    [leaked] = sim.leak_pod_deleted_without_cni_del("ns", "web-0")
    env.decide()  # the leak's timer starts
    lead = gc_leader(env, rate_limit=1.0, monotonic=lambda: 0.0)  # one token, never refilled
    passes(env, lead, 2, every=GRACE / 2 + 1)
    assert env.decide() == 1  # confirmed: its decision and the handle's third scan in the same pass
    lead.step()
    assert [(r.result, r.ip) for r in env.audit()] == [(Result.RELEASED, leaked)]
    [obs] = lead.handles.history.values()
    assert obs.divergence.cls.value == "skewed" and obs.due(env.clock.now(), GRACE)  # due: no token left
    assert handle_obj(env, skewed)["spec"]["block"] == {cidr: 2}
