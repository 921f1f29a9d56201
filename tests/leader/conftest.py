"""The leader against real Redis and the simulated cluster over real HTTP, with the worker side in-process.

`Env` wires one scenario: a `SimCluster` writing into the store a `SimApiServer` serves, the producer's
`Mirror` kept in step by relisting the store (`sync`), the shard jobs run in-process (`validate`) on a
`FakeClock`, and leaders built on the official client (`leader`), each with its own User-Agent so the
server's request log tells them apart.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from kubernetes import client as k8s

from kubeio.election import Leadership
from lab.apiserver.apiserver import RequestRecord, SimApiServer
from lab.apiserver.resources import resources_for
from lab.apiserver.store import Store
from lab.cluster.cluster import SimCluster
from producer.kinds import Kind as KubeKind
from producer.mirror import Mirror
from producer.relist import Kind
from shared.calicogroup import V1, V3, CalicoGroup
from shared.clock import FakeClock
from shared.config import Settings
from shared.consistency import check_consistency
from shared.keys import Keys
from shared.kubevirt import parse_vm, parse_vmi
from shared.parse import parse_block, parse_node, parse_pod
from shared.records import decode_allocation
from shared.shard import DEFAULT_SHARDS, shard_of
from shared.snapshot import Inventory, build_inventory
from tests.polling import wait_until  # noqa: F401  (re-exported to the tests here)
from tests.redis.conftest import client, clock, keys, redis_endpoint  # noqa: F401  (fixtures)
from workers.leader import kube
from workers.leader.audit import AuditRecord, read_audit
from workers.leader.loop import Leader
from workers.leader.settings import LeaderSettings
from workers.shards.validate import validate_shard

GRACE = 900.0
WRITES = ("POST", "PUT", "PATCH", "DELETE")
CALICO_IPAM = ("ipamblocks", "ipamhandles", "blockaffinities")


def user_agent(identity: str) -> str:
    return f"ipamgc-leader/{identity}"


def leader_settings(**overrides: Any) -> LeaderSettings:
    """Settings for stepping a leader by hand: no rate limit, cleanup on every pass.  The backstop scan
    runs only on a term's first pass: the in-process `Mirror` keeps the empty-block index (`P:empty`),
    so the scenarios here see empty blocks through it, as a running leader does.  The handle collector
    is off unless a test turns it on (`handle_gc=True`, tests/leader/test_handle_gc*.py): its scans
    would add list requests to the scenarios that count them."""
    values: dict[str, Any] = {
        "handle_gc": False,
        "base": Settings(),
        "rate_limit": 0.0,
        "deleted_node_rate_limit": 0.0,
        "cleanup_interval_seconds": 0.0,
        "idle_cleanup_interval_seconds": 0.0,  # every pass cleans, active or not
        "gated_seconds": 0.01,
        "empty_block_interval_seconds": 0.0,
        "empty_block_backstop_seconds": 1e9,
        "idle_seconds": 0.01,
        "heartbeat_seconds": 0.0,
    }
    values.update(overrides)
    return LeaderSettings(**values)


@dataclass
class Env:
    server: SimApiServer
    sim: SimCluster
    mirror: Mirror
    redis: redis.Redis
    keys: Keys
    clock: FakeClock
    grace: float | None = GRACE
    _api_clients: list[k8s.ApiClient] = field(default_factory=list)

    def use_pools(self, pools: list[tuple[str, int]]) -> SimCluster:
        """Replace the (still empty) simulated cluster by one with these IP pools."""
        self.server.store.remove_hook(self.sim._on_commit)
        self.sim = SimCluster(self.server.store, seed=7, pools=pools)
        return self.sim

    # -- the watcher and the workers, in-process ----------------------------------------------------

    def sync(self) -> None:
        """What the watcher would have mirrored by now (a relist of every kind)."""
        store = self.server.store
        self.mirror.set_config(self.grace, True)
        self.mirror.relist(Kind.NODES, [parse_node(o) for o in store.list("nodes")["items"]])
        self.mirror.relist(Kind.PODS, [parse_pod(o) for o in store.list("pods")["items"]])
        self.mirror.relist(Kind.BLOCKS, [parse_block(o) for o in store.list("ipamblocks")["items"]])
        if store.serves("virtualmachines"):  # KubeVirt installed: the watcher mirrors its VMs and VMIs too
            vms = [parse_vm(o) for o in store.list("virtualmachines")["items"]]
            vmis = [parse_vmi(o) for o in store.list("virtualmachineinstances")["items"]]
            self.mirror.kubevirt.relist(KubeKind.VMS, vms, frozenset())
            self.mirror.kubevirt.relist(KubeKind.VMIS, vmis, frozenset())
        self.mirror.mark_synced()

    def validate(self, shards: list[int] | None = None) -> int:
        """Run a shard job on each shard (all by default); returns the decisions emitted."""
        emitted = 0
        for s in range(DEFAULT_SHARDS) if shards is None else shards:
            emitted += validate_shard(s, client=self.redis, keys=self.keys, clock=self.clock).decisions
        return emitted

    def decide(self) -> int:
        self.sync()
        return self.validate()

    # -- leaders ----------------------------------------------------------------------------------------

    def api(self, identity: str) -> kube.CalicoApi:
        api_client = self.server.api_client()
        api_client.user_agent = user_agent(identity)
        self._api_clients.append(api_client)
        return kube.CalicoApi(api_client)

    def leader(
        self,
        identity: str = "leader-a",
        start: bool = True,
        monotonic: Callable[[], float] = time.monotonic,
        **overrides: Any,
    ) -> Leader:
        lead = Leader(
            leader_settings(**overrides),
            self.redis,
            self.api(identity),
            Leadership.granted(identity),
            clock=self.clock,
            monotonic=monotonic,
        )
        if start:
            lead.start()
        return lead

    def close(self) -> None:
        for c in self._api_clients:
            c.close()

    # -- what happened ----------------------------------------------------------------------------------

    def audit(self) -> list[AuditRecord]:
        return read_audit(self.redis, self.keys)[0]

    def writes(
        self, identity: str | None = None, resources: tuple[str, ...] = CALICO_IPAM
    ) -> list[RequestRecord]:
        return [
            r
            for r in self.server.requests
            if r.method in WRITES
            and r.resource in resources
            and (identity is None or r.user_agent == user_agent(identity))
        ]

    def inventory(self) -> Inventory:
        return build_inventory(self.sim.export()["items"])

    def consistent(self) -> list[str]:
        return [str(p) for p in check_consistency(self.inventory())]

    def pending(self, group: str = "leader") -> int:
        try:
            info = self.redis.xpending(self.keys.decisions, group)
        except redis.ResponseError:
            return 0
        return int(info["pending"])


def decided_leak(env: Env) -> tuple[str, str, int]:
    """A pod leak on node-a, decided by the worker and not yet read by the leader: (ip, alloc id, shard)."""
    sim = env.sim
    sim.add_node("node-a")
    sim.create_pod("ns", "web-0", "node-a")
    sim.create_pod("ns", "web-1", "node-a")
    env.decide()
    [ip] = sim.leak_pod_deleted_without_cni_del("ns", "web-0")
    env.decide()
    env.clock.advance(GRACE + 1)
    assert env.decide() == 1
    shard = shard_of("node-a")
    [alloc_id] = [
        k.decode()
        for k, v in env.redis.hgetall(env.keys.alloc(shard)).items()
        if decode_allocation(k.decode(), v).ip == ip
    ]
    return ip, alloc_id, shard


@contextlib.contextmanager
def leader_env(
    client: redis.Redis,  # noqa: F811
    keys: Keys,  # noqa: F811
    clock: FakeClock,  # noqa: F811
    calico: CalicoGroup = V1,
) -> Iterator[Env]:
    """An `Env` on a simulated cluster that serves Calico's objects in `calico` only."""
    store = Store(resources_for(calico), seed=7)
    with SimApiServer(store, bookmark_interval=0.2) as server:
        sim = SimCluster(store, seed=7)
        mirror = Mirror(client, keys, clock=clock)
        e = Env(server, sim, mirror, client, keys, clock)
        try:
            yield e
        finally:
            e.close()


@pytest.fixture
def env(client: redis.Redis, keys: Keys, clock: FakeClock) -> Iterator[Env]:  # noqa: F811
    with leader_env(client, keys, clock) as e:
        yield e


@pytest.fixture
def env_v3(client: redis.Redis, keys: Keys, clock: FakeClock) -> Iterator[Env]:  # noqa: F811
    """The same, on a cluster with Calico's projectcalico.org/v3 CRDs only."""
    with leader_env(client, keys, clock, V3) as e:
        yield e
