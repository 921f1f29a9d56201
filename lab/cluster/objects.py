"""Kubernetes objects (nodes, pods) as a real API server returns them, and whole-cluster snapshots.

`ClusterBuilder` puts the in-memory Calico IPAM together with nodes and pods so that a test, an example or
the simulator can write a scenario in a few lines: a pod created by the CNI, a pod deleted without a CNI
DEL, an IP changed under a live pod, a node deleted with its pods, and so on.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lab.cluster.ipam import CalicoIPAM
from lab.cluster.podshape import CREATOR, KUBELET, PodSize, dress

CREATED = "2025-01-21T17:51:44Z"


def node_object(name: str, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": _uid("node", name),
            "labels": {"kubernetes.io/hostname": name, **(labels or {})},
            "creationTimestamp": CREATED,
        },
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def node_ready(node: Mapping[str, Any]) -> bool:
    """The node's `Ready` condition is True: its kubelet runs and reports (Unknown or False: lost, or
    NotReady)."""
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(
        isinstance(c, Mapping) and c.get("type") == "Ready" and c.get("status") == "True" for c in conditions
    )


def put_pod(store: Any, obj: dict[str, Any], field_manager: str = CREATOR) -> dict[str, Any]:
    """Pod `obj` in the cluster as the kubelet reports it: created in its namespace (made if missing)
    by `field_manager`, where the API server makes every new pod Pending with no IPs, then its status
    written through ``/status`` (the kubelet's).  `store`: the simulated `Store` or a `RestStore` (the
    actors' store interface)."""
    ns = str(obj["metadata"]["namespace"])
    store.ensure_namespace(ns)
    status = obj.get("status")
    created: dict[str, Any] = store.create("pods", ns, obj, field_manager=field_manager)
    if status and created.get("status") != status:
        created["status"] = status
        name = created["metadata"]["name"]
        created = store.replace("pods", ns, name, created, subresource="status", field_manager=KUBELET)
    return created


def pod_object(
    namespace: str,
    name: str,
    node: str,
    ips: list[str],
    phase: str = "Running",
    reason: str | None = None,
    annotations: Mapping[str, str] | None = None,
    *,
    size: PodSize = "small",
    seed: int = 0,
    container_id: str | None = None,
    launcher: bool = False,
) -> dict[str, Any]:
    """Pod `namespace/name` on `node` reporting `ips`.  `size` (`lab.cluster.podshape`): ``small``, the
    simulator's minimal pod; ``real`` and ``large``, a Deployment's pod of real size (seeded by `seed`;
    `container_id`: its sandbox's, as Calico's CNI annotates it; `launcher`: a KubeVirt virt-launcher
    pod), the fields the collectors read unchanged."""
    status: dict[str, Any] = {"phase": phase}
    if ips:
        status["podIP"] = ips[0]
        status["podIPs"] = [{"ip": ip} for ip in ips]
    if reason:
        status["reason"] = reason
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": _uid("pod", f"{namespace}/{name}"),
            "annotations": dict(annotations or {}),
            "creationTimestamp": CREATED,
        },
        "spec": {"nodeName": node, "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}]},
        "status": status,
    }
    if size != "small":
        dress(pod, size, seed, container_id=container_id, launcher=launcher)
    return pod


def _uid(kind: str, name: str) -> str:
    h = hashlib.sha256(f"{kind}:{name}".encode()).hexdigest()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def container_id(namespace: str, name: str, generation: int = 0) -> str:
    return hashlib.sha256(f"{namespace}/{name}/{generation}".encode()).hexdigest()


@dataclass
class ClusterBuilder:
    """A small cluster in memory; `snapshot()` returns what `kubectl get ... -o json` would print."""

    ipam: CalicoIPAM = field(default_factory=CalicoIPAM.with_pools)
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)

    def add_node(
        self, name: str, labels: Mapping[str, str] | None = None, tunnel: str | None = "vxlanTunnelAddress"
    ) -> str:
        self.nodes[name] = node_object(name, labels)
        if tunnel is not None:
            self.add_tunnel(name, tunnel)
        return name

    def add_tunnel(self, node: str, kind: str = "vxlanTunnelAddress") -> str:
        prefix = {
            "ipipTunnelAddress": "ipip-tunnel-addr",
            "vxlanTunnelAddress": "vxlan-tunnel-addr",
            "vxlanV6TunnelAddress": "vxlan-v6-tunnel-addr",
            "wireguardTunnelAddress": "wireguard-tunnel-addr",
            "wireguardV6TunnelAddress": "wireguard-v6-tunnel-addr",
        }[kind]
        version = 6 if "V6" in kind else 4
        return self.ipam.assign(node, f"{prefix}-{node}", {"node": node, "type": kind}, version=version)

    def cni_add(
        self, namespace: str, name: str, node: str, dual_stack: bool = False, generation: int = 0
    ) -> tuple[str, list[str]]:
        """What Calico's CNI plugin does on ADD: one handle, one IP per family, with owner attributes."""
        handle = f"k8s-pod-network.{container_id(namespace, name, generation)}"
        attrs = {
            "namespace": namespace,
            "node": node,
            "pod": name,
            "timestamp": "2025-01-21 17:51:44.123456789 +0000 UTC",
        }
        ips = [self.ipam.assign(node, handle, attrs, version=4)]
        if dual_stack:
            ips.append(self.ipam.assign(node, handle, attrs, version=6))
        return handle, ips

    def add_pod(
        self,
        namespace: str,
        name: str,
        node: str,
        dual_stack: bool = False,
        phase: str = "Running",
        report: bool = True,
        reason: str | None = None,
    ) -> tuple[str, list[str]]:
        """A pod scheduled on `node`, given IPs by the CNI and (with `report`) reporting them in status."""
        handle, ips = self.cni_add(namespace, name, node, dual_stack)
        self.pods[(namespace, name)] = pod_object(namespace, name, node, ips if report else [], phase, reason)
        return handle, ips

    def set_pod_ips(self, namespace: str, name: str, ips: list[str]) -> None:
        pod = self.pods[(namespace, name)]
        pod["status"].pop("podIP", None)
        pod["status"].pop("podIPs", None)
        if ips:
            pod["status"]["podIP"] = ips[0]
            pod["status"]["podIPs"] = [{"ip": ip} for ip in ips]

    def delete_pod(self, namespace: str, name: str, cni_del: bool = True) -> None:
        """Delete a pod; without `cni_del` its IPs leak (the kubelet never ran CNI DEL)."""
        self.pods.pop((namespace, name))
        if cni_del:
            self.ipam.release_handle(f"k8s-pod-network.{container_id(namespace, name)}")

    def delete_node(self, name: str, with_pods: bool = False) -> None:
        """Remove the Node object (its IPAM data stays, as when a node dies); optionally its pods too."""
        self.nodes.pop(name)
        if with_pods:
            for key, pod in list(self.pods.items()):
                if pod["spec"]["nodeName"] == name:
                    del self.pods[key]

    def snapshot(self) -> dict[str, Any]:
        items = [
            *self.nodes.values(),
            *self.pods.values(),
            *self.ipam.objects(),
        ]
        return {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": items}
