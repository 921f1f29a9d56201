"""Every add path has its remove path: after any sequence of events, the mirror equals a fresh relist.

Calico's v3.32-era memory leaks (#12277/#12279) came from indexes that were added to and never removed
from.  Here random churn (pods added, deleted with and without CNI DEL, allocations whose `node` attribute
changes, nodes deleted) is mirrored event by event; the result must be exactly what mirroring the final
state into an empty Redis gives.
"""

from __future__ import annotations

from typing import Any

import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from producer.mirror import Mirror
from producer.relist import Kind
from shared.gcrecords import decode_empty
from shared.keys import Keys
from tests.fixtures.redis import Cluster

# Work-queue and timer keys are not mirror state.
TRANSIENT = ("dirty:", "queued:", "inflight:", "cand:", "due:", "decided:", "dirtyblocks:", ":state")

ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 2), st.booleans()),
        st.tuples(st.just("delete"), st.integers(0, 20), st.booleans()),
        st.tuples(st.just("move"), st.integers(0, 20), st.integers(0, 2)),
        st.tuples(st.just("delete-node"), st.integers(0, 2), st.booleans()),
    ),
    max_size=12,
)


def snapshot(client: redis.Redis, keys: Keys) -> dict[bytes, Any]:
    out: dict[bytes, Any] = {}
    for key in client.scan_iter(f"{keys.prefix}:*", count=1000):
        if any(t in key.decode() for t in TRANSIENT):
            continue
        kind = client.type(key)
        if kind == b"hash":
            value = client.hgetall(key)
            if key == keys.empty.encode():  # `since` is when the watcher saw it: compare the host only
                value = {f: decode_empty(v).host for f, v in value.items()}
            out[key] = value
        elif kind == b"set":
            out[key] = client.smembers(key)
        else:
            out[key] = kind
    return out


def mirror_all(mirror: Mirror, cluster: Cluster) -> None:
    mirror.relist(Kind.NODES, cluster.nodes())
    mirror.relist(Kind.PODS, cluster.pods())
    mirror.relist(Kind.BLOCKS, cluster.blocks())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=ops)
def test_incremental_mirror_equals_a_fresh_relist(
    client: redis.Redis, keys: Keys, steps: list[tuple[Any, ...]]
) -> None:
    client.flushall()
    cluster = Cluster()
    b = cluster.builder
    nodes = ["node-0", "node-1", "node-2"]
    for n in nodes:
        b.add_node(n)
    mirror = Mirror(client, keys)
    mirror_all(mirror, cluster)
    serial = 0
    for op in steps:
        pods = sorted(b.pods)
        if op[0] == "add":
            serial += 1
            node = nodes[op[1]]
            if node in b.nodes:
                b.add_pod("default", f"p{serial}", node, dual_stack=op[2])
                mirror.apply_pod(cluster.pod("default", f"p{serial}"))
        elif op[0] == "delete" and pods:
            ns, name = pods[op[1] % len(pods)]
            b.delete_pod(ns, name, cni_del=op[2])
            mirror.delete_pod(ns, name)
        elif op[0] == "move" and pods:
            ns, name = pods[op[1] % len(pods)]
            for block in b.ipam.blocks.values():
                for attr in block["spec"]["attributes"]:
                    if attr.get("secondary", {}).get("pod") == name:
                        attr["secondary"]["node"] = nodes[op[2]]
        elif op[0] == "delete-node" and nodes[op[1]] in b.nodes:
            b.delete_node(nodes[op[1]], with_pods=op[2])
            mirror.delete_node(nodes[op[1]])
            mirror.relist(Kind.PODS, cluster.pods())
        mirror.apply_blocks(cluster.blocks())
    incremental = snapshot(client, keys)
    client.flushall()
    mirror_all(Mirror(client, keys), cluster)
    assert incremental == snapshot(client, keys)
