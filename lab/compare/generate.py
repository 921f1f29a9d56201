"""Random small clusters for `ipamgc compare --generate N --seed S`, each a `kubectl get … -o json` List.

Why a module of its own: the comparison is only as good as the cases it meets, and hand-written scenarios
hold only what their authors thought of.  Each cluster here is drawn from one seeded `random.Random` (the
same seed gives the same clusters, byte for byte) and mixes what Calico's collector must decide: pods
running, pods deleted without a CNI DEL, finished pods, an IP changed under a pod, a pod that moved nodes
under its allocation (#12257), dual-stack pods reporting one family or both, tunnel addresses (IPIP,
VXLAN, WireGuard, IPv6 too), nodes deleted with or without their pods, empty blocks, a Windows-reserved
block, an allocation with no `node` attribute, IP cooldown (an `IPAMConfig` with `ipCooldownSeconds`
and ordinals already cooling) and KubeVirt VMs (kept, restarted elsewhere, or deleted with no CNI DEL).
The objects are written by the simulator's Calico IPAM (`lab.cluster.ipam.CalicoIPAM`, via
`ClusterBuilder`), which writes what Calico's IPAM library writes.  Kept small (a few nodes, tens of
pods): each comparison runs two collectors to quiet on it.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

from lab.cluster.kubevirt import vm_handle, vm_object, vmi_object
from lab.cluster.objects import ClusterBuilder, pod_object
from shared import blockops
from shared.names import handle_name
from shared.netaddr import ip_to_ordinal, parse_network

__all__ = ["Generated", "generate", "generate_many"]

TUNNELS = ("vxlanTunnelAddress", "ipipTunnelAddress", "wireguardTunnelAddress", None)


@dataclass(frozen=True, slots=True)
class Generated:
    name: str
    doc: dict[str, Any]  # the List
    features: tuple[str, ...]  # what was drawn into it (for the report)


def _uncount(cb: ClusterBuilder, handle: str, cidr: str) -> None:
    """The IPAMHandle's count for `cidr` lowered by one, as the library does on a release."""
    obj = cb.ipam.handles.get(handle_name(handle))
    if obj is None:
        return
    counts: dict[str, int] = obj["spec"]["block"]
    counts[cidr] = counts.get(cidr, 0) - 1
    if counts[cidr] <= 0:
        del counts[cidr]
    if not counts:
        del cb.ipam.handles[handle_name(handle)]


def generate(seed: int, index: int = 0, now: float | None = None) -> Generated:
    """One random cluster (`now`: when cooling ordinals are stamped relative to; default the clock)."""
    rng = random.Random(f"ipamgc-compare/{seed}/{index}")
    cb = ClusterBuilder()
    now = time.time() if now is None else now
    features: set[str] = set()
    dual = rng.random() < 0.4
    nodes = [f"node-{n}" for n in range(rng.randint(2, 4))]
    for node in nodes:
        tunnel = rng.choice(TUNNELS)
        cb.add_node(node, tunnel=tunnel)
        if tunnel:
            features.add("tunnel")
        if dual and tunnel == "vxlanTunnelAddress" and rng.random() < 0.5:
            cb.add_tunnel(node, "vxlanV6TunnelAddress")
    pods: list[tuple[str, str, str, list[str]]] = []  # ns, name, node, ips
    for n, node in enumerate(nodes):
        for p in range(rng.randint(2, 7)):
            name = f"pod-{n}-{p}"
            pod_dual = dual and rng.random() < 0.6
            _, ips = cb.add_pod("default", name, node, dual_stack=pod_dual)
            pods.append(("default", name, node, ips))
            if pod_dual:
                features.add("dual-stack")
    rng.shuffle(pods)
    for ns, name, node, ips in pods[: rng.randint(1, max(1, len(pods) // 2))]:
        if (ns, name) not in cb.pods:
            continue
        kind = rng.choice(("leak", "leak", "finished", "mismatch", "moved", "one-family", "clean"))
        if kind == "leak":
            cb.delete_pod(ns, name, cni_del=False)
            features.add("pod-leak")
        elif kind == "finished":
            cb.pods[(ns, name)]["status"]["phase"] = rng.choice(("Succeeded", "Failed"))
            features.add("finished-pod")
        elif kind == "mismatch":
            cb.set_pod_ips(ns, name, ["10.99.0." + str(rng.randint(1, 250)), *ips[1:]])
            features.add("ip-mismatch")
        elif kind == "moved" and len(nodes) > 1:
            cb.pods[(ns, name)]["spec"]["nodeName"] = rng.choice([x for x in nodes if x != node])
            features.add("stale-node-attribute")
        elif kind == "one-family" and len(ips) > 1:
            cb.set_pod_ips(ns, name, ips[:1])
            features.add("dual-stack-one-family")
        elif kind == "clean":
            cb.delete_pod(ns, name, cni_del=True)
    for node in nodes:
        if rng.random() < 0.35:
            for _ in range(rng.randint(1, 2)):
                cb.ipam.claim_block(node)
            features.add("empty-block")
    if rng.random() < 0.15:
        cb.ipam.reserve_windows(cb.ipam.claim_block(nodes[0]))
        features.add("windows-reserved")
    if rng.random() < 0.2:
        cb.ipam.assign(nodes[-1], "lb-ingress", {"service": "ingress", "namespace": "default"})
        features.add("no-node-attribute")
    extra: list[dict[str, Any]] = []
    if rng.random() < 0.35:
        extra += _vms(cb, rng, nodes)
        features.add("kubevirt")
    cooldown = 0
    if rng.random() < 0.3:
        cooldown = rng.randint(1, 4)
        _cool(cb, rng, cooldown, now)
        features.add("ip-cooldown")
    # nodes lost last (their pods, VMs and blocks were made while they lived)
    for node in nodes[1:]:
        if rng.random() < 0.3:
            cb.delete_node(node, with_pods=rng.random() < 0.7)
            features.add("node-deleted")
    doc = cb.snapshot()
    doc["items"] += extra
    if cooldown:
        spec = {"strictAffinity": False, "autoAllocateBlocks": True, "ipCooldownSeconds": cooldown}
        doc["items"].append(
            {
                "apiVersion": "crd.projectcalico.org/v1",
                "kind": "IPAMConfig",
                "metadata": {"name": "default"},
                "spec": spec,
            }
        )
    return Generated(f"random-{seed}-{index:03d}", doc, tuple(sorted(features)))


def _vms(cb: ClusterBuilder, rng: random.Random, nodes: list[str]) -> list[dict[str, Any]]:
    """KubeVirt VMs with Calico's persistent VM addresses: some kept, some deleted with no CNI DEL."""
    objects: list[dict[str, Any]] = []
    for i in range(rng.randint(1, 3)):
        name, node = f"vm-{i}", rng.choice(nodes)
        standalone = rng.random() < 0.2
        handle = vm_handle("vms", name)
        launcher = f"virt-launcher-{name}-abcde"
        attrs = {
            "namespace": "vms",
            "node": node,
            "pod": launcher,
            "vmi-name": name,
            "vmi-uid": f"uid-{name}",
        }
        ip = cb.ipam.assign(node, handle, attrs)
        if rng.random() < 0.3:
            continue  # deleted with no CNI DEL: the IP leaks (a VM candidate waits max(5 min, grace))
        if not standalone:
            objects.append(vm_object("vms", name))
        objects.append(vmi_object("vms", name, node, not standalone))
        cb.pods[("vms", launcher)] = pod_object("vms", launcher, node, [ip])
    return objects


def _cool(cb: ClusterBuilder, rng: random.Random, cooldown: int, now: float) -> None:
    """Some pods deleted with a CNI DEL under a cooldown: their ordinals parked, `releasedAt` some
    seconds ago (some already past the cooldown)."""
    running = [key for key in cb.pods if key[0] == "default"]
    for ns, name in rng.sample(running, min(len(running), rng.randint(1, 3))):
        pod = cb.pods.pop((ns, name))
        for entry in pod["status"].get("podIPs", []):
            ip = entry["ip"]
            cidr = cb.ipam.block_of(ip)
            block = cb.ipam.blocks[cidr]
            attrs_index = block["spec"]["allocations"][ip_to_ordinal(parse_network(cidr), ip)]
            handle = block["spec"]["attributes"][attrs_index]["handle_id"]
            when = now - rng.uniform(0, 2 * cooldown)
            out = blockops.release(
                block["spec"], [blockops.ReleaseRequest(ip, handle)], cooldown=cooldown, now=when
            )
            block["spec"] = out.spec
            _uncount(cb, handle, cidr)


def generate_many(count: int, seed: int, now: float | None = None) -> list[Generated]:
    return [generate(seed, i, now) for i in range(count)]
