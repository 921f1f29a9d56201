"""The test suite's Calico-rule scenarios as snapshots, for `ipamgc compare --snapshot`.

The scenarios of `tests/workers/shards/test_validate.py`, `tests/ipamgc/test_check*.py` and the README's and
issue 35's divergences, each built with `ClusterBuilder` as those tests build them and written as a
`kubectl get … -o json` List (`ipamgc check`'s snapshot format; an `IPAMConfig` or `IPPool` where the
scenario needs one):

    python -m tests.scenarios DIR        # writes DIR/<scenario>.json, one file per scenario
    ipamgc compare --snapshot DIR/pod-deleted-without-cni-del.json --calico-kube-controllers PATH

`SCENARIOS` maps each name to its builder; `LEAKS` names, per scenario, the IPs ipamgc releases (what
`tests/lab/compare/test_plumbing.py` checks the comparison reports against a collector that does nothing).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from lab.cluster.kubevirt import vm_handle, vm_object, vmi_object
from lab.cluster.objects import ClusterBuilder, pod_object
from shared import blockops
from shared.names import handle_name
from shared.netaddr import ip_to_ordinal, parse_network

NS = "default"
Scenario = tuple[dict[str, Any], set[str]]  # the List, the IPs ipamgc releases at a short grace


def _doc(cb: ClusterBuilder, *extra: dict[str, Any]) -> dict[str, Any]:
    if not cb.pods:  # `ipamgc check` refuses a List with blocks and no pod (an export missing them)
        cb.pods[(NS, "bystander")] = pod_object(NS, "bystander", next(iter(cb.nodes)), [], phase="Pending")
    doc = cb.snapshot()
    doc["items"] += list(extra)
    return doc


def _calico(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "crd.projectcalico.org/v1", "kind": kind, "metadata": {"name": name}, "spec": spec}


def pod_deleted_without_cni_del() -> Scenario:
    cb = ClusterBuilder()
    cb.add_node("node-1")
    _, ips = cb.add_pod(NS, "web-0", "node-1")
    cb.add_pod(NS, "web-1", "node-1")
    cb.delete_pod(NS, "web-0", cni_del=False)
    return _doc(cb), set(ips)


def deleted_node_with_its_pods() -> Scenario:
    cb = ClusterBuilder()
    cb.add_node("node-1")
    cb.add_node("node-2", tunnel=None)
    tunnel = cb.add_tunnel("node-2")
    _, a = cb.add_pod(NS, "a", "node-2")
    _, b = cb.add_pod(NS, "b", "node-2")
    cb.add_pod(NS, "c", "node-1")
    cb.delete_node("node-2", with_pods=True)
    return _doc(cb), {*a, *b, tunnel}


def deleted_node_whose_pods_remain() -> Scenario:
    cb = ClusterBuilder()
    cb.add_node("node-1")
    cb.add_node("node-2")
    cb.add_pod(NS, "a", "node-2")
    cb.delete_node("node-2", with_pods=False)
    return _doc(cb), set()


def dual_stack_reporting_one_family() -> Scenario:
    cb = ClusterBuilder()
    cb.add_node("node-1")
    _, ips = cb.add_pod(NS, "dual-0", "node-1", dual_stack=True)
    cb.set_pod_ips(NS, "dual-0", ips[:1])
    return _doc(cb), set()


def terminal_pod() -> Scenario:
    cb = ClusterBuilder()
    cb.add_node("node-1")
    _, ips = cb.add_pod(NS, "job-0", "node-1", phase="Succeeded")
    _, failed = cb.add_pod(NS, "evicted-0", "node-1", phase="Failed", reason="Evicted")
    return _doc(cb), {*ips, *failed}


def stale_node_attribute() -> Scenario:
    """The pod moved to node-2 but reports the IP its allocation on node-1 holds (#12257, PR #13538)."""
    cb = ClusterBuilder()
    cb.add_node("node-1")
    cb.add_node("node-2")
    cb.add_pod(NS, "moved-0", "node-1")
    cb.pods[(NS, "moved-0")]["spec"]["nodeName"] = "node-2"
    return _doc(cb), set()


def ip_changed_under_a_pod() -> Scenario:
    cb = ClusterBuilder()
    cb.add_node("node-1")
    _, old = cb.add_pod(NS, "moved-0", "node-1")
    _, new = cb.cni_add(NS, "moved-0", "node-1", generation=1)
    cb.set_pod_ips(NS, "moved-0", new)
    return _doc(cb), set(old)


def empty_blocks() -> Scenario:
    """node-1 with two empty blocks beside a used one; node-2 with only empty blocks."""
    cb = ClusterBuilder()
    cb.add_node("node-1", tunnel=None)
    cb.add_node("node-2", tunnel=None)
    cb.add_pod(NS, "web-0", "node-1")
    cb.ipam.claim_block("node-1")
    cb.ipam.claim_block("node-1")
    cb.ipam.claim_block("node-2")
    cb.ipam.claim_block("node-2")
    return _doc(cb), set()


def no_node_attribute() -> Scenario:
    cb = ClusterBuilder()
    cb.add_node("node-1")
    cb.ipam.assign("node-1", "lb-ingress", {"service": "ingress", "namespace": NS})
    return _doc(cb), set()


def every_kind() -> Scenario:
    """`tests/ipamgc/test_check.py`'s cluster with one allocation of each type, plus a leak."""
    cb = ClusterBuilder()
    cb.add_node("node-1")
    cb.add_node("node-2", tunnel="wireguardTunnelAddress")
    cb.add_pod(NS, "web-0", "node-1")
    _, orphan = cb.add_pod(NS, "orphan-0", "node-1")
    cb.delete_pod(NS, "orphan-0", cni_del=False)
    cb.ipam.assign("node-2", "lb-abc", {"node": "node-2", "service": "ingress", "namespace": NS})
    cb.ipam.reserve_windows(cb.ipam.claim_block("node-2"))
    return _doc(cb), set(orphan)


def unaffine_windows_block_lending_a_leak() -> Scenario:
    """`tests/ipamgc/test_check_verdicts.py`: win-1's block, affinity gone, lends an IP to a deleted pod."""
    cb = ClusterBuilder()
    cb.add_node("node-1")
    cidr = cb.ipam.claim_block("win-1")
    cb.ipam.reserve_windows(cidr)
    ip = cb.ipam.assign_in_block(
        cidr, "k8s-pod-network.borrow", {"namespace": NS, "node": "node-1", "pod": "b"}
    )
    cb.ipam.blocks[cidr]["spec"]["affinity"] = None
    return _doc(cb), {ip}


def borrowed_ip_leaked() -> Scenario:
    cb = ClusterBuilder()
    cb.add_node("node-1")
    cb.add_node("node-2")
    cidr = cb.ipam.node_blocks("node-1")[0]
    attrs = {
        "namespace": NS,
        "node": "node-2",
        "pod": "borrower",
        "timestamp": "2025-01-21 17:51:44 +0000 UTC",
    }
    ip = cb.ipam.assign_in_block(cidr, "k8s-pod-network.borrower", attrs)
    return _doc(cb), {ip}


def kubevirt_vms() -> Scenario:
    """A VM kept, a standalone VMI kept, a VM gone with its node (released at once)."""
    cb = ClusterBuilder()
    cb.add_node("node-1")
    cb.add_node("node-2")
    extra: list[dict[str, Any]] = []
    leaked: set[str] = set()
    for name, node, standalone, keep in (
        ("vm-0", "node-1", False, True),
        ("vm-1", "node-1", True, True),
        ("vm-2", "node-2", False, False),
    ):
        launcher = f"virt-launcher-{name}-abcde"
        attrs = {"namespace": "vms", "node": node, "pod": launcher, "vmi-name": name, "vmi-uid": f"u-{name}"}
        ip = cb.ipam.assign(node, vm_handle("vms", name), attrs)
        if keep:
            extra += [] if standalone else [vm_object("vms", name)]
            extra.append(vmi_object("vms", name, node, not standalone))
            cb.pods[("vms", launcher)] = pod_object("vms", launcher, node, [ip])
        else:
            leaked.add(ip)
    leaked.add(
        cb.ipam.assign("node-2", "vxlan-tunnel-addr-node-2", {"node": "node-2", "type": "vxlanTunnelAddress"})
    )
    cb.delete_node("node-2", with_pods=True)
    return _doc(cb, *extra), leaked


# -- the divergences (README; issue 35) -------------------------------------------------------------


def terminating_pod_with_blanked_cni_annotation() -> Scenario:
    """Issue 35 item 3: a terminating pod whose CNI annotation was blanked (its CNI DEL ran)."""
    cb = ClusterBuilder()
    cb.add_node("node-1")
    _, ips = cb.add_pod(NS, "going-0", "node-1")
    meta = cb.pods[(NS, "going-0")]["metadata"]
    meta["deletionTimestamp"] = "2025-01-21T18:00:00Z"
    meta["finalizers"] = ["example.com/hold"]
    meta["annotations"]["cni.projectcalico.org/podIP"] = ""
    return _doc(cb), set(ips)


def finished_pod_with_malformed_ip() -> Scenario:
    """Issue 35 item 4: a Succeeded pod whose status IP does not parse."""
    cb = ClusterBuilder()
    cb.add_node("node-1")
    _, ips = cb.add_pod(NS, "job-0", "node-1", phase="Succeeded")
    cb.set_pod_ips(NS, "job-0", ["10.244.0.999"])
    return _doc(cb), set(ips)


def cooldown_on_a_deleted_node() -> Scenario:
    """Issue 35 item 5: a deleted node whose only block holds an aged cooldown ordinal."""
    cb = ClusterBuilder()
    cb.add_node("node-1")
    cb.add_node("node-2", tunnel=None)
    _, ips = cb.add_pod(NS, "a", "node-2")
    cidr = cb.ipam.block_of(ips[0])
    block = cb.ipam.blocks[cidr]
    index = block["spec"]["allocations"][ip_to_ordinal(parse_network(cidr), ips[0])]
    handle = block["spec"]["attributes"][index]["handle_id"]
    out = blockops.release(
        block["spec"], [blockops.ReleaseRequest(ips[0], handle)], cooldown=2, now=time.time() - 60
    )
    block["spec"] = out.spec
    del cb.ipam.handles[handle_name(handle)]
    del cb.pods[(NS, "a")]
    _, leak = cb.add_pod(NS, "b", "node-2")
    cb.delete_node("node-2", with_pods=True)
    config = _calico(
        "IPAMConfig", "default", {"strictAffinity": False, "autoAllocateBlocks": True, "ipCooldownSeconds": 2}
    )
    return _doc(cb, config), set(leak)


def pool_no_longer_selects_the_node() -> Scenario:
    """Issue 35 item 6: node-1's pool now selects no node; a leak released there leaves its block empty."""
    cb = ClusterBuilder()
    cb.add_node("node-1", tunnel=None)
    cb.add_pod(NS, "kept", "node-1")
    cb.ipam.claim_block("node-1")  # a second block: the first may go
    _, ips = cb.add_pod(NS, "web-0", "node-1")
    cb.delete_pod(NS, "web-0", cni_del=False)
    pools = [
        _calico(
            "IPPool",
            "default-ipv4-ippool",
            {"cidr": "10.244.0.0/16", "blockSize": 26, "nodeSelector": "!all()"},
        ),
        _calico("IPPool", "default-ipv6-ippool", {"cidr": "fd00:10:244::/112", "blockSize": 122}),
    ]
    return _doc(cb, *pools), set(ips)


def whole_handle_with_a_valid_member() -> Scenario:
    """A handle holding a valid IP and a leaked one (an IP changed under a live pod, same handle)."""
    cb = ClusterBuilder()
    cb.add_node("node-1")
    handle, _ = cb.add_pod(NS, "web-0", "node-1")
    attrs = {"namespace": NS, "node": "node-1", "pod": "web-0", "timestamp": "2025-01-21 17:51:44 +0000 UTC"}
    cb.ipam.assign("node-1", handle, attrs)  # a second IP of the same handle, not reported by the pod
    return _doc(cb), set()


SCENARIOS: dict[str, Callable[[], Scenario]] = {
    f.__name__.replace("_", "-"): f
    for f in (
        pod_deleted_without_cni_del,
        deleted_node_with_its_pods,
        deleted_node_whose_pods_remain,
        dual_stack_reporting_one_family,
        terminal_pod,
        stale_node_attribute,
        ip_changed_under_a_pod,
        empty_blocks,
        no_node_attribute,
        every_kind,
        unaffine_windows_block_lending_a_leak,
        borrowed_ip_leaked,
        kubevirt_vms,
        terminating_pod_with_blanked_cni_annotation,
        finished_pod_with_malformed_ip,
        cooldown_on_a_deleted_node,
        pool_no_longer_selects_the_node,
        whole_handle_with_a_valid_member,
    )
}


def write_all(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for name, build in SCENARIOS.items():
        doc, _ = build()
        path = directory / f"{name}.json"
        path.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")
        out.append(path)
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.scenarios DIR", file=sys.stderr)
        return 2
    for path in write_all(Path(argv[0])):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
