"""Regenerate the example snapshots: `python examples/generate.py` (deterministic)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import orjson

from lab.cluster.objects import ClusterBuilder, pod_object

HERE = Path(__file__).parent


def healthy() -> dict[str, Any]:
    """Three live nodes, a dozen running pods, one dual-stack, one pending without an IP yet."""
    c = ClusterBuilder()
    for n in ("node-1", "node-2", "node-3"):
        c.add_node(n)
    for i in range(12):
        c.add_pod("default", f"web-{i}", f"node-{i % 3 + 1}")
    c.add_pod("default", "api-0", "node-1", dual_stack=True)
    c.add_pod("batch", "job-starting", "node-2", phase="Pending", report=False)
    return c.snapshot()


def leaks() -> dict[str, Any]:
    """Every kind of leak Calico's users hit, and the look-alikes that must be kept."""
    c = ClusterBuilder()
    for n in ("node-1", "node-2", "node-3"):
        c.add_node(n)
    c.add_pod("default", "web-0", "node-1")
    c.add_pod("default", "web-1", "node-2")
    # pod deleted without a CNI DEL, node alive: a candidate, released after the grace period
    c.add_pod("default", "orphan-0", "node-1")
    c.delete_pod("default", "orphan-0", cni_del=False)
    # IP changed under a live pod: its old allocation is a candidate
    c.add_pod("default", "moved-0", "node-2")
    _, new_ips = c.cni_add("default", "moved-0", "node-2", generation=1)
    c.set_pod_ips("default", "moved-0", new_ips)
    # a finished Job's pod keeps its object: its IP is a candidate
    c.add_pod("batch", "report-28871", "node-2", phase="Succeeded")
    # dual-stack pod whose status only lists IPv4 (#5044): IPv6 looks leaked but the handle holds it
    _, ips = c.add_pod("default", "dual-0", "node-1", dual_stack=True)
    c.set_pod_ips("default", "dual-0", ips[:1])
    # stale node attribute (#12257): CNI wrote node-1 but the pod runs on node-2 and reports the IP
    _, stale_ips = c.cni_add("default", "stale-0", "node-1")
    c.pods[("default", "stale-0")] = pod_object("default", "stale-0", "node-2", stale_ips)
    # an empty second block on node-1: released after the grace period (never the node's last block)
    c.ipam.claim_block("node-1")
    # node-3 was deleted with its pods and nobody ran CNI DEL: everything on it goes now
    c.add_pod("default", "gone-0", "node-3")
    c.add_pod("default", "gone-1", "node-3")
    c.ipam.claim_block("node-3")
    c.delete_node("node-3", with_pods=True)
    # a LoadBalancer IP has no node attribute: never touched
    cidr = c.ipam.node_blocks("node-2")[0]
    c.ipam.assign_in_block(cidr, "lb-q2VuZXJhdGVkU2VydmljZQ", {"service": "ingress", "namespace": "default"})
    return c.snapshot()


def malformed() -> dict[str, Any]:
    """A healthy cluster with objects no tool should trust; `check` reports and skips them."""
    snap = healthy()
    items = snap["items"]
    blocks = [i for i in items if i["kind"] == "IPAMBlock"]
    pods = [i for i in items if i["kind"] == "Pod"]
    bad_len = copy.deepcopy(blocks[0])
    bad_len["metadata"]["name"] = "10-244-200-0-26"
    bad_len["spec"]["cidr"] = "10.244.200.0/26"
    bad_len["spec"]["allocations"] = bad_len["spec"]["allocations"][:63]
    no_spec = {
        "apiVersion": "crd.projectcalico.org/v1",
        "kind": "IPAMBlock",
        "metadata": {"name": "10-244-201-0-26"},
    }
    bad_pod = copy.deepcopy(pods[0])
    bad_pod["status"]["podIPs"] = [{"ip": "10.244.0.999"}]
    items[items.index(pods[0])] = bad_pod
    items.extend([bad_len, no_spec])
    return snap


def main() -> None:
    for name, build in (("healthy", healthy), ("leaks", leaks), ("malformed", malformed)):
        (HERE / f"{name}.json").write_bytes(orjson.dumps(build(), option=orjson.OPT_INDENT_2) + b"\n")


if __name__ == "__main__":
    main()
