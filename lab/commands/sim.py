"""`ipamgc sim …`: the simulated cluster on its own (serve it, export it, measure it)."""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import click
import orjson

from ipamgc.commands import context_option, kubeconfig_option, kubeconfig_path
from ipamgc.commands.flags import Group
from ipamgc.inventory import fetch_live_inventory
from lab.apiserver.apiserver import SimApiServer
from lab.apiserver.resources import KUBEVIRT_RESOURCES, resources_for
from lab.apiserver.store import SimApiError, Store
from lab.cluster.churn import Churn
from lab.cluster.cluster import SimCluster
from lab.cluster.kubelet import DEFAULT_DELAY, Kubelets
from lab.cluster.kubevirt import KubeVirt
from lab.cluster.podshape import POD_SIZE_HELP, POD_SIZES, PodSize
from lab.cluster.scale import measure
from producer.kubevirt import discover
from shared import calicogroup
from shared.calicogroup import V1, CalicoGroup, parse_group, plural_of_kind
from shared.errors import IpamgcError

_LOADABLE = {
    "Node": ("nodes", False),
    "Pod": ("pods", True),
    "VirtualMachine": ("virtualmachines", True),
    "VirtualMachineInstance": ("virtualmachineinstances", True),
}
_KUBEVIRT_KINDS = ("VirtualMachine", "VirtualMachineInstance")
# Calico's kinds are loaded from either API group (`shared.calicogroup.plural_of_kind`), converted to the
# group the store serves.


def load_snapshot(store: Store, path: str) -> int:
    """Load a `kubectl get … -o json` List into the store (server-set metadata is dropped).  Calico's
    objects may be of either API group; each is stored as the group the store serves has it."""
    try:
        doc = orjson.loads(Path(path).read_bytes() if path != "-" else sys.stdin.buffer.read())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise click.ClickException(f"{path}: cannot load snapshot: {exc}") from exc
    items = doc.get("items") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise click.ClickException(f"{path}: not a Kubernetes List")
    loaded = 0
    if any(isinstance(i, dict) and i.get("kind") in _KUBEVIRT_KINDS for i in items):
        store.serve(KUBEVIRT_RESOURCES)  # the snapshot's cluster has KubeVirt: so does this one
    for raw in items:
        kind = raw.get("kind") if isinstance(raw, dict) else None
        calico = plural_of_kind(kind)
        if isinstance(raw, dict) and calico is not None and store.calico is not None:
            item, plural, namespaced = calicogroup.convert(raw, store.calico), calico, False
        elif isinstance(raw, dict) and kind in _LOADABLE:
            item, (plural, namespaced) = raw, _LOADABLE[kind]
        else:
            continue
        meta = item.setdefault("metadata", {})
        for key in ("resourceVersion", "uid", "creationTimestamp", "generation", "managedFields"):
            meta.pop(key, None)
        namespace = meta.get("namespace") if namespaced else None
        try:
            if namespace:
                store.ensure_namespace(str(namespace))
            # the snapshot's state as it stands (`restore`): status included, no admission
            store.create(plural, namespace, item, copy=False, restore=True)
            loaded += 1
        except SimApiError as exc:
            click.echo(f"ipamgc sim: skipped {kind}/{meta.get('name')}: {exc.message}", err=True)
    return loaded


def _group(value: str) -> CalicoGroup:
    try:
        return parse_group(value)
    except IpamgcError as exc:
        raise click.BadParameter(str(exc), param_hint="--calico-api-group") from exc


def _faults(spec: str | None) -> dict[str, Any] | None:
    if not spec:
        return None
    text = Path(spec[1:]).read_text() if spec.startswith("@") else spec
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--faults") from exc
    if isinstance(payload, list):
        payload = {"action": "set", "rules": payload}
    if not isinstance(payload, dict):
        raise click.BadParameter("expected a JSON object or a list of rules", param_hint="--faults")
    return payload


@click.group(cls=Group)
def sim() -> None:
    """The simulated cluster: a Kubernetes API server with a Calico CNI that leaks on purpose."""


@sim.command(renamed={"--faults": ("--api-faults",)})
@click.option("--host", default="127.0.0.1", show_default=True, help="Listen address (loopback by default).")
@click.option("--port", default=0, show_default=True, help="Listen port (0: a free one).")
@click.option("--nodes", default=10, show_default=True, help="Nodes to create.")
@click.option("--pods-per-node", default=10, show_default=True, help="Running pods per node.")
@click.option("--seed", default=0, show_default=True, help="Seed of everything random.")
@click.option("--snapshot", metavar="FILE", help="Load this kubectl List instead of generating a cluster.")
@click.option("--churn", "churn_rate", default=0.0, show_default=True, help="Pod events per second.")
@click.option("--leak-rate", default=0.0, show_default=True, help="Fraction of pod deletions that leak.")
@click.option(
    "--api-faults", "faults", metavar="JSON|@FILE", help="Fault rules for the API server (see README)."
)
@click.option("--kubeconfig-out", metavar="PATH", help="Write a kubeconfig for this server here.")
@click.option("--leak-grace-period", default="15m0s", show_default=True, help="Written to the KCC default.")
@click.option(
    "--kubevirt/--no-kubevirt",
    default=False,
    show_default=True,
    help="Serve kubevirt.io/v1 VirtualMachines and VirtualMachineInstances (also when --snapshot holds any).",
)
@click.option("--vms", default=0, show_default=True, help="KubeVirt VMs to create (with --kubevirt).")
@click.option(
    "--calico-api-group",
    default=V1.api_version,
    show_default=True,
    metavar="GROUP/VERSION",
    callback=lambda ctx, param, value: _group(value),
    help="Serve Calico's objects in this group only: crd.projectcalico.org/v1, or projectcalico.org/v3 "
    "(Calico 3.33's native v3 CRDs).",
)
@click.option(
    "--kubelet-delay",
    default=DEFAULT_DELAY,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds a Ready node's simulated kubelet takes to stop a pod deleted gracefully and confirm "
    "(CNI DEL, then the grace-0 DELETE); a NotReady or lost node's pods stay Terminating.",
)
@click.option(
    "--pod-size",
    type=click.Choice(POD_SIZES),
    default="small",
    show_default=True,
    help=POD_SIZE_HELP,
)
@click.option("--duration", type=float, help="Stop after this many seconds (default: until Ctrl-C).")
def serve(
    host: str,
    port: int,
    nodes: int,
    pods_per_node: int,
    seed: int,
    snapshot: str | None,
    churn_rate: float,
    leak_rate: float,
    faults: str | None,
    kubeconfig_out: str | None,
    leak_grace_period: str,
    kubevirt: bool,
    vms: int,
    calico_api_group: CalicoGroup,
    kubelet_delay: float,
    pod_size: PodSize,
    duration: float | None,
) -> None:
    """Serve a simulated cluster over HTTP; prints its URL, then runs until stopped."""
    fault_payload = _faults(faults)
    if vms and not kubevirt:
        raise click.BadParameter("VMs need KubeVirt: add --kubevirt", param_hint="--vms")
    if vms and (snapshot or not nodes):
        raise click.BadParameter(
            "VMs are made on the generated nodes (not with --snapshot)", param_hint="--vms"
        )
    store = Store(resources_for(calico_api_group), seed=seed)
    if kubevirt:
        store.serve(KUBEVIRT_RESOURCES)
    cluster = SimCluster(store, seed=seed, pod_size=pod_size)
    started = time.monotonic()
    if snapshot:
        count = load_snapshot(store, snapshot)
        click.echo(f"ipamgc sim: loaded {count} objects from {snapshot}", err=True)
    else:
        cluster.bootstrap(leak_grace_period=leak_grace_period or None)
        cluster.bulk_populate(nodes, pods_per_node)
        names = sorted(cluster.node_names)
        driver = KubeVirt(cluster)
        for i in range(vms):
            driver.create_vm("vms", f"vm-{i:05d}", names[i % len(names)])
        click.echo(
            f"ipamgc sim: {nodes} nodes, {cluster.pod_count()} pods in {time.monotonic() - started:.1f}s",
            err=True,
        )
    server = SimApiServer(store, host=host, port=port, fault_seed=seed)
    if fault_payload is not None:
        server.faults.control(fault_payload)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with server, Kubelets(cluster, kubelet_delay):
        if kubeconfig_out:
            server.write_kubeconfig(kubeconfig_out)
        click.echo(server.url, nl=True)
        sys.stdout.flush()
        churn = None
        if churn_rate > 0:
            churn = Churn(cluster, churn_rate, leak_rate, seed=seed)
            churn.start(stop)
        try:
            stop.wait(duration)
        except KeyboardInterrupt:
            pass
        finally:
            stop.set()
        if churn is not None:
            s = churn.stats
            click.echo(
                f"ipamgc sim: churn {s.events} events ({s.created} created, {s.deleted} deleted, "
                f"{s.leaked} leaked, {s.errors} errors); violations {len(cluster.truth.violations)}",
                err=True,
            )


@sim.command()
@click.option("--nodes", default=5000, show_default=True)
@click.option("--pods-per-node", default=30, show_default=True)
@click.option("--churn", "churn_rate", default=200.0, show_default=True, help="Pod events per second.")
@click.option("--duration", default=20.0, show_default=True, help="Seconds of churn.")
@click.option("--page", default=500, show_default=True, help="List page size (limit).")
@click.option("--seed", default=0, show_default=True)
def scale(nodes: int, pods_per_node: int, churn_rate: float, duration: float, page: int, seed: int) -> None:
    """Measure the simulator itself: load, paginated list, churn while a watch is served."""
    result = measure(nodes, pods_per_node, churn_rate, duration, page, seed)
    click.echo(json.dumps(result, indent=2))


@sim.command(renamed={"--output": ("--output-file",), "-o": ("--output-file",)})
@kubeconfig_option()
@context_option
@click.option(
    "--output-file",
    "output",
    default="-",
    show_default=True,
    metavar="PATH",
    help="File to write; - for stdout.",
)
def export(kubeconfig: str | None, kube_context: str | None, output: str) -> None:
    """Write the `kubectl get nodes,pods,ipamblocks,ipamhandles,blockaffinities -A -o json` List that
    `ipamgc check --snapshot` reads, from the simulated cluster (or any cluster the kubeconfig names)."""
    try:
        items = fetch_live_inventory(kubeconfig_path(kubeconfig), kube_context, kubevirt=discover)
    except (IpamgcError, OSError) as exc:
        raise click.ClickException(f"cannot read the cluster: {exc}") from exc
    doc = {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": items}
    data = orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n"
    if output == "-":
        sys.stdout.buffer.write(data)
    else:
        Path(output).write_bytes(data)
        click.echo(f"ipamgc sim: wrote {len(items)} objects to {output}", err=True)
