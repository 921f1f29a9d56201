"""What the mirror's tests share (`test_mirror*.py`, the layout and backstop tests): a cluster with a pod of
each kind and a LoadBalancer IP, loaded into the mirror by relists; every shard settled; the indexes read."""

from __future__ import annotations

import redis

from producer.mirror import Mirror
from producer.relist import Kind
from shared.keys import Keys
from shared.shard import DEFAULT_SHARDS
from tests.fixtures.redis import Cluster

LB_HANDLE = "lb-5XbT1N8cQm"


def build(cluster: Cluster) -> dict[str, list[str]]:
    """node-1: tunnel, web-0, web-1 (dual-stack); node-2: tunnel, db-0; a LoadBalancer IP with no node."""
    b = cluster.builder
    b.add_node("node-1")
    b.add_node("node-2")
    out = {}
    for ns, name, node, dual in [
        ("default", "web-0", "node-1", False),
        ("default", "web-1", "node-1", True),
        ("default", "db-0", "node-2", False),
    ]:
        handle, ips = b.add_pod(ns, name, node, dual_stack=dual)
        out[name] = [f"{handle}/{ip}" for ip in ips]
    cidr = b.ipam.node_blocks("node-2", 4)[0]
    lb_ip = b.ipam.assign_in_block(cidr, LB_HANDLE, {"namespace": "default", "service": "front"})
    out["lb"] = [f"{LB_HANDLE}/{lb_ip}"]
    out["tunnel-1"] = [f"vxlan-tunnel-addr-node-1/{_tunnel_ip(cluster, 'node-1')}"]
    out["tunnel-2"] = [f"vxlan-tunnel-addr-node-2/{_tunnel_ip(cluster, 'node-2')}"]
    return out


def _tunnel_ip(cluster: Cluster, node: str) -> str:
    for block in cluster.blocks():
        for a in block.iter_allocations():
            if a.handle == f"vxlan-tunnel-addr-{node}":
                return a.ip
    raise AssertionError(node)


def load(mirror: Mirror, cluster: Cluster) -> None:
    mirror.relist(Kind.NODES, cluster.nodes())
    mirror.relist(Kind.PODS, cluster.pods())
    mirror.relist(Kind.BLOCKS, cluster.blocks())


def settle(client: redis.Redis, keys: Keys) -> None:
    """As if every shard job had run: nothing dirty, nothing queued."""
    for s in range(DEFAULT_SHARDS):
        client.delete(keys.dirty(s), keys.queued(s))


def podallocs(mirror: Mirror, pod: str) -> dict[str, str]:
    """The watcher's pod → allocations index (in its memory since it stopped living in Redis)."""
    ns, name = pod.split("/", 1)
    return {i: str(s) for i, s in mirror.pod_allocations(ns, name).items()}


def node_ids(ids: dict[str, list[str]], *names: str) -> set[str]:
    return {i for n in names for i in ids[n]}
