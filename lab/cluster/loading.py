"""Loading the simulated cluster in bulk: the Calico objects every cluster has, a whole cluster in one
sweep, and its export.

Why a module of its own: :class:`~lab.cluster.cluster.SimCluster` changes a running cluster one event at a
time, as the kubelet, the controllers and the CNI do, recording the ground truth as it goes.  Building
the cluster the benchmark and the tests start from is another job: 150,000 pods cannot go through the
CNI one API write at a time, so they are computed in memory (`lab.cluster.ipam.CalicoIPAM`, the same
library rules) and stored in one sweep, with the truth and the cluster's bookkeeping filled in as if
they had.  This module does that through :class:`LoadTarget`, the part of the cluster it fills (no
import of `lab.cluster.cluster`, which uses it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from lab.apiserver.store import SimApiError, Store
from lab.cluster.cni import CalicoCNI
from lab.cluster.ipam import CalicoIPAM, Pool
from lab.cluster.objects import node_object, pod_object
from lab.cluster.podshape import CREATOR, PodSize
from lab.cluster.truth import GroundTruth
from shared.calicogroup import V1, CalicoGroup
from shared.netaddr import IPNetwork

__all__ = [
    "TUNNEL_HANDLE",
    "LoadTarget",
    "bootstrap",
    "bulk_populate",
    "export",
    "node_name",
    "pod_name",
    "set_ip_cooldown",
]

TUNNEL_HANDLE = {
    "ipipTunnelAddress": "ipip-tunnel-addr",
    "vxlanTunnelAddress": "vxlan-tunnel-addr",
    "vxlanV6TunnelAddress": "vxlan-v6-tunnel-addr",
    "wireguardTunnelAddress": "wireguard-tunnel-addr",
    "wireguardV6TunnelAddress": "wireguard-v6-tunnel-addr",
}


def node_name(n: int) -> str:
    return f"node-{n:05d}"


def pod_name(i: int) -> str:
    return f"pod-{i:07d}"


class LoadTarget(Protocol):
    """`lab.cluster.cluster.SimCluster` as a bulk load fills it: its store, CNI, truth and bookkeeping."""

    store: Store
    cni: CalicoCNI
    calico: CalicoGroup
    truth: GroundTruth
    clock: Callable[[], float]
    tunnel_type: str | None
    seed: int
    pod_size: PodSize
    pod_handles: dict[tuple[str, str], tuple[str, list[str]]]
    node_names: set[str]

    def _clock_ns(self) -> int: ...

    def _container_id(self, ns: str, pod: str) -> str: ...

    def _track_pod(self, key: tuple[str, str], node: str) -> None: ...


def bootstrap(
    store: Store,
    pools: Iterable[tuple[IPNetwork, int]],
    leak_grace_period: str | None = "15m0s",
    datastore_ready: bool = True,
) -> None:
    """`SimCluster.bootstrap`: the cluster-scoped Calico objects, created or replaced."""
    node_cfg: dict[str, Any] = {}
    if leak_grace_period is not None:
        node_cfg["leakGracePeriod"] = leak_grace_period
    objects: list[tuple[str, dict[str, Any]]] = [
        (
            "clusterinformations",
            _crd("ClusterInformation", "default", {"datastoreReady": datastore_ready}),
        ),
        (
            "kubecontrollersconfigurations",
            # The policy-name migrator disabled: Calico's kube-controllers otherwise waits for a calico-node
            # DaemonSet (which a simulated cluster has not) before its data feed, and its IPAM GC never runs.
            _crd(
                "KubeControllersConfiguration",
                "default",
                {"controllers": {"node": node_cfg, "migration": {"policyNameMigrator": "Disabled"}}},
            ),
        ),
        (
            "ipamconfigs",
            _crd("IPAMConfig", "default", {"strictAffinity": False, "autoAllocateBlocks": True}),
        ),
    ]
    for i, (net, prefix) in enumerate(pools):
        name = f"default-ipv{net.version}-ippool" if i < 2 else f"pool-{i}"
        objects.append(("ippools", _crd("IPPool", name, {"cidr": str(net), "blockSize": prefix})))
    for plural, obj in objects:
        try:
            store.create(plural, None, obj)
        except SimApiError as exc:
            if exc.code != 409:
                raise
            current = store.get(plural, None, obj["metadata"]["name"])
            obj["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            store.replace(plural, None, obj["metadata"]["name"], obj)


def set_ip_cooldown(store: Store, seconds: int) -> None:
    """Set `IPAMConfig/default`'s `ipCooldownSeconds` (Calico 3.33), as an operator would."""
    try:
        obj = store.get("ipamconfigs", None, "default")
    except SimApiError as exc:
        if exc.code != 404:
            raise
        spec = {"strictAffinity": False, "autoAllocateBlocks": True, "ipCooldownSeconds": seconds}
        store.create("ipamconfigs", None, _crd("IPAMConfig", "default", spec))
        return
    obj["spec"]["ipCooldownSeconds"] = seconds
    store.replace("ipamconfigs", None, "default", obj)


def bulk_populate(
    cluster: LoadTarget, nodes: int, pods_per_node: int, namespaces: int = 10, dual_stack_every: int = 0
) -> None:
    """`SimCluster.bulk_populate`: the cluster `populate` builds, computed in memory, loaded in one sweep."""
    ipam = CalicoIPAM(
        pools=[Pool(net, prefix) for net, prefix in cluster.cni.pools],
        clock_ns=cluster._clock_ns(),
        calico=cluster.calico,
    )
    truth, store = cluster.truth, cluster.store
    at = cluster.clock()
    node_objs = []
    for n in range(nodes):
        name = node_name(n)
        node_objs.append(node_object(name))
        if cluster.tunnel_type is not None:
            handle = f"{TUNNEL_HANDLE[cluster.tunnel_type]}-{name}"
            ip = ipam.assign(name, handle, {"node": name, "type": cluster.tunnel_type}, borrow=True)
            truth.allocated(ip, handle, f"tunnel:{name}", at)
    pod_objs = []
    for n in range(nodes):
        node = node_name(n)
        for p in range(pods_per_node):
            i = n * pods_per_node + p
            ns, pod = f"ns-{i % namespaces}", pod_name(i)
            sandbox = cluster._container_id(ns, pod)
            handle = f"k8s-pod-network.{sandbox}"
            attrs = {
                "namespace": ns,
                "node": node,
                "pod": pod,
                "timestamp": "2025-01-21 17:51:44.0 +0000 UTC",
            }
            ips = [ipam.assign(node, handle, attrs, version=4)]
            if dual_stack_every and i % dual_stack_every == 0:
                ips.append(ipam.assign(node, handle, attrs, version=6))
            for ip in ips:
                truth.allocated(ip, handle, f"{ns}/{pod}", at)
            cluster.pod_handles[(ns, pod)] = (handle, ips)
            cluster._track_pod((ns, pod), node)
            pod_objs.append(
                pod_object(ns, pod, node, ips, size=cluster.pod_size, seed=cluster.seed, container_id=sandbox)
            )
    for obj in node_objs:
        store.create("nodes", None, obj, copy=False)
        cluster.node_names.add(obj["metadata"]["name"])
    for plural, objs in (
        ("ipamblocks", ipam.blocks.values()),
        ("blockaffinities", ipam.affinities.values()),
        ("ipamhandles", ipam.handles.values()),
    ):
        store.create_many(plural, objs, copy=False)
    for n in range(min(namespaces, len(pod_objs))):
        store.ensure_namespace(f"ns-{n}")
    # the cluster as it stands (`restore`): the pods already running, status and IPs included
    store.create_many("pods", pod_objs, copy=False, restore=True, field_manager=CREATOR)
    cluster.cni.adopt(ipam.blocks.keys(), {k: list(v) for k, v in ipam._by_node.items()}, dict(ipam._cursor))


def export(store: Store) -> dict[str, Any]:
    """`SimCluster.export`: the `kubectl get ... -A -o json` List of the objects the GC reads."""
    items: list[dict[str, Any]] = []
    plurals = ["nodes", "pods", "ipamblocks", "ipamhandles", "blockaffinities"]
    plurals += [p for p in ("virtualmachines", "virtualmachineinstances") if store.serves(p)]
    for plural in plurals:
        items.extend(store.list(plural)["items"])
    return {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": items}


def _crd(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A Calico object by its crd.projectcalico.org/v1 kind; the store stamps the kind and apiVersion of
    the group it serves."""
    return {"apiVersion": V1.api_version, "kind": kind, "metadata": {"name": name}, "spec": spec}
