"""A fresh simulated cluster for one collector: the snapshot loaded, Calico's cluster objects completed,
served on loopback, every IPAM write recorded.

Why a module of its own: the two runs of a comparison must start from identical clusters, and nothing of
one run may leak into the other, so each run builds its own `Store` and `SimApiServer` here from the same
List.  What a `kubectl get` snapshot lacks and a Calico cluster has is added the same way for both:
`ClusterInformation/default` (datastore ready), `IPAMConfig/default` (no cooldown unless the List holds
one), an `IPPool` per family for the blocks the List holds (unless it holds pools), and
`KubeControllersConfiguration/default` as `lab.kubecontrollers.kcc_spec` writes it, with the
comparison's grace period, which both collectors read.
"""

from __future__ import annotations

import copy
import ipaddress
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lab.apiserver.apiserver import SimApiServer
from lab.apiserver.resources import KUBEVIRT_RESOURCES
from lab.apiserver.store import SimApiError, Store
from lab.compare.recorder import Recorder
from lab.kubecontrollers import kcc_spec
from shared import calicogroup
from shared.calicogroup import V1, plural_of_kind

__all__ = ["KUBEVIRT_KINDS", "Sandbox", "load_items", "pools_for", "sandbox"]

KUBEVIRT_KINDS = ("VirtualMachine", "VirtualMachineInstance")
_CORE = {
    "Node": ("nodes", False),
    "Pod": ("pods", True),
    "VirtualMachine": ("virtualmachines", True),
    "VirtualMachineInstance": ("virtualmachineinstances", True),
}
_SERVER_SET = ("resourceVersion", "uid", "creationTimestamp", "generation", "managedFields")


def load_items(store: Store, items: list[Any]) -> list[str]:
    """Store a List's items (as `ipamgc sim serve --snapshot` does); returns one line per item skipped."""
    skipped: list[str] = []
    if any(isinstance(i, dict) and i.get("kind") in KUBEVIRT_KINDS for i in items):
        store.serve(KUBEVIRT_RESOURCES)
    group = store.calico or V1
    for raw in items:
        kind = raw.get("kind") if isinstance(raw, dict) else None
        calico = plural_of_kind(kind)
        if isinstance(raw, dict) and calico is not None:
            item, plural, namespaced = calicogroup.convert(raw, group), calico, False
        elif isinstance(raw, dict) and kind in _CORE:
            item, (plural, namespaced) = copy.deepcopy(raw), _CORE[str(kind)]
        else:
            skipped.append(f"skipped an item of kind {kind!r}")
            continue
        meta = item.setdefault("metadata", {})
        for key in _SERVER_SET:
            meta.pop(key, None)
        namespace = meta.get("namespace") if namespaced else None
        try:
            if namespace:
                store.ensure_namespace(str(namespace))
            store.create(plural, namespace, item, restore=True)  # the snapshot's state, status included
            if meta.get("deletionTimestamp") and meta.get("finalizers"):
                # a create drops deletionTimestamp, as an API server does: a terminating object (held
                # by its finalizers) is made terminating again the way it became so, by a delete
                store.delete(plural, namespace, str(meta.get("name")))
        except SimApiError as exc:
            skipped.append(f"skipped {kind}/{meta.get('name')}: {exc.message}")
    return skipped


def pools_for(block_cidrs: list[str]) -> list[tuple[str, int]]:
    """IP pools holding the given blocks, when the input holds none: per block, its /16 (IPv4) or /112
    (IPv6) supernet with the block's prefix as the block size (Calico's defaults: 10.244.0.0/16 with /26
    blocks; fd00:10:244::/112 with /122)."""
    out: dict[str, int] = {}
    for cidr in block_cidrs:
        try:
            net = ipaddress.ip_network(cidr)
        except ValueError:
            continue
        wide = 16 if net.version == 4 else 112
        pool = net.supernet(new_prefix=min(wide, net.prefixlen))
        out.setdefault(str(pool), net.prefixlen)
    if not any(ipaddress.ip_network(p).version == 4 for p in out):
        out["10.244.0.0/16"] = 26
    return sorted(out.items())


def _create_absent(store: Store, plural: str, kind: str, name: str, spec: dict[str, Any]) -> None:
    obj = {"apiVersion": V1.api_version, "kind": kind, "metadata": {"name": name}, "spec": spec}
    try:
        store.create(plural, None, calicogroup.convert(obj, store.calico or V1))
    except SimApiError as exc:
        if exc.code != 409:
            raise


def complete(store: Store, grace: str) -> None:
    """Add what a Calico cluster has and a snapshot lacks (see the module's docstring)."""
    _create_absent(store, "clusterinformations", "ClusterInformation", "default", {"datastoreReady": True})
    _create_absent(
        store, "ipamconfigs", "IPAMConfig", "default", {"strictAffinity": False, "autoAllocateBlocks": True}
    )
    if not store.count("ippools"):
        specs = [b.get("spec") for b in store.list("ipamblocks")["items"]]
        # a malformed block (no spec, no CIDR) gives no pool: Calico and ipamgc both skip it
        blocks = [str(spec["cidr"]) for spec in specs if isinstance(spec, dict) and spec.get("cidr")]
        for i, (cidr, size) in enumerate(pools_for(blocks)):
            spec = {"cidr": cidr, "blockSize": size, "nodeSelector": "all()", "vxlanMode": "Always"}
            _create_absent(store, "ippools", "IPPool", f"pool-{i}", spec)
    kcc: dict[str, Any] = {
        "apiVersion": V1.api_version,
        "kind": "KubeControllersConfiguration",
        "metadata": {"name": "default"},
        "spec": kcc_spec(grace),
    }
    try:
        current = store.get("kubecontrollersconfigurations", None, "default")
    except SimApiError:
        store.create("kubecontrollersconfigurations", None, calicogroup.convert(kcc, store.calico or V1))
    else:
        kcc["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        store.replace(
            "kubecontrollersconfigurations", None, "default", calicogroup.convert(kcc, store.calico or V1)
        )


class Sandbox:
    """One run's cluster: `store`, `server` (started), `kubeconfig`, `recorder` (hooked on the store)."""

    def __init__(self, store: Store, server: SimApiServer, kubeconfig: Path, recorder: Recorder) -> None:
        self.store = store
        self.server = server
        self.kubeconfig = kubeconfig
        self.recorder = recorder


@contextmanager
def sandbox(items: list[Any], grace: str, workdir: Path, collector: str, seed: int = 0) -> Iterator[Sandbox]:
    """A fresh store with `items` loaded and completed, served on loopback until the block ends."""
    store = Store(seed=seed)
    load_items(store, items)
    complete(store, grace)
    recorder = Recorder(collector)
    store.add_hook(recorder)
    with SimApiServer(store, fault_seed=seed) as server:
        kubeconfig = server.write_kubeconfig(workdir / f"kubeconfig-{collector}")
        yield Sandbox(store, server, kubeconfig, recorder)
