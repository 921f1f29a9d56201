"""Real-size pods in the simulated cluster (issue 42): `small` is today's pod byte for byte, `real` and
`large` lie in their bands of JSON bytes (docs/pod-sizes.md), and the collectors' view of a pod is the same
whatever its size: the project's pod parser and the watcher's fast decoder give the same slim record."""

from __future__ import annotations

import statistics
from datetime import UTC, datetime

import orjson
import pytest
from click.testing import CliRunner

from ipamgc.cli import cli
from ipamgc.commands.up import sim_options
from ipamgc.stack import SIM_POD_SIZE_HELP, SIM_POD_SIZES
from lab.apiserver.apiserver import SimApiServer
from lab.apiserver.resources import KUBEVIRT_RESOURCES
from lab.apiserver.store import Store
from lab.chaos.runner import build_parser
from lab.cluster.cluster import SimCluster
from lab.cluster.kubevirt import KubeVirt
from lab.cluster.objects import pod_object
from lab.cluster.podshape import POD_SIZE_HELP, POD_SIZES, PodSize, pod_size
from lab.cluster.restapi import RestStore
from producer import slimpods
from shared.model import ANNOTATION_POD_IPS, Pod
from shared.parse import parse_pod

#: Mean JSON bytes of a served pod, per size (docs/pod-sizes.md has the measured means and the sources).
CLOCK = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
BANDS = {"small": (300, 1_000), "real": (10_000, 15_000), "large": (45_000, 60_000)}


def _store(seed: int) -> Store:
    """A store whose clock stands still, so that two clusters built one after the other compare."""
    return Store(seed=seed, clock=lambda: CLOCK)


def _cluster(size: PodSize, seed: int = 4, kubevirt: bool = False) -> tuple[Store, SimCluster]:
    store = _store(seed)
    if kubevirt:
        store.serve(KUBEVIRT_RESOURCES)
    sim = SimCluster(store, seed=seed, pod_size=size, clock=CLOCK.timestamp)
    sim.bootstrap()
    sim.bulk_populate(6, 15, dual_stack_every=4)  # the bulk loader's pods
    for i in range(12):  # the churn's path: created Pending, then the kubelet's status
        sim.create_pod(f"ns-{i % 3}", f"churn-{i:07d}", f"node-0000{i % 6}", dual_stack=i % 5 == 0)
    sim.dual_stack_single_status("ns-0", "dual-single", "node-00001")
    sim.leak_terminal_pod("ns-1", "churn-0000001")
    sim.leak_ip_changed("ns-2", "churn-0000002")
    store.delete("pods", "ns-0", "churn-0000003")  # graceful: Terminating (deletionTimestamp)
    if kubevirt:
        vms = KubeVirt(sim)
        vms.create_vm("vms", "db", "node-00002")
        vms.migrate_vm("vms", "db", "node-00003")
    return store, sim


def _served(store: Store) -> list[bytes]:
    """Every pod as the server sends it (what a list or a watch event carries)."""
    return [orjson.dumps(p) for p in store.list("pods", copy=False)["items"]]


@pytest.mark.parametrize("size", POD_SIZES)
def test_the_mean_pod_of_each_size_lies_in_its_band(size: PodSize) -> None:
    store, _ = _cluster(size)
    mean = statistics.fmean(len(b) for b in _served(store))
    low, high = BANDS[size]
    assert low <= mean <= high, f"{size}: {mean:.0f} bytes, not within {low}..{high}"


def test_small_is_todays_pod_byte_for_byte() -> None:
    today = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "web-0",
            "namespace": "default",
            "uid": pod_object("default", "web-0", "n", [])["metadata"]["uid"],
            "annotations": {},
            "creationTimestamp": "2025-01-21T17:51:44Z",
        },
        "spec": {
            "nodeName": "node-1",
            "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}],
        },
        "status": {"phase": "Running", "podIP": "10.64.0.1", "podIPs": [{"ip": "10.64.0.1"}]},
    }
    built = pod_object("default", "web-0", "node-1", ["10.64.0.1"], size="small", seed=9, container_id="c")
    assert orjson.dumps(built) == orjson.dumps(today)
    # A small cluster is the cluster every test and figure was taken on: the same bytes as one built
    # without a size.
    default_store = _store(4)
    default = SimCluster(default_store, seed=4)
    default.bootstrap()
    default.bulk_populate(6, 15, dual_stack_every=4)
    small_store = _store(4)
    small = SimCluster(small_store, seed=4, pod_size="small")
    small.bootstrap()
    small.bulk_populate(6, 15, dual_stack_every=4)
    assert _served(default_store) == _served(small_store)


def _slim_records(store: Store) -> dict[tuple[str, str], tuple[Pod, Pod | None]]:
    out = {}
    for raw in _served(store):
        generic = parse_pod(orjson.loads(raw))
        fast = slimpods.pod(raw)
        assert fast is not None, "the watcher's fast decoder refused a simulated pod"
        out[generic.key] = (generic, fast[0] if isinstance(fast, tuple) else fast)
    return out


@pytest.mark.parametrize("size", ["real", "large"])
def test_a_dressed_pod_is_the_same_slim_record_as_the_small_one(size: PodSize) -> None:
    """Same seed, same names: every pod (bulk-loaded, churned, terminal, re-addressed, Terminating, dual-stack
    reporting one IP, a KubeVirt launcher) parses to exactly the record of its small twin, resourceVersion
    included (the dressed cluster is the small one event for event)."""
    small_store, small = _cluster("small", kubevirt=True)
    big_store, big = _cluster(size, kubevirt=True)
    small_pods, big_pods = _slim_records(small_store), _slim_records(big_store)
    assert small_pods.keys() == big_pods.keys() and len(small_pods) > 100
    for key, (generic, fast) in small_pods.items():
        assert big_pods[key] == (generic, fast), key
    assert big.truth.in_use_ips() == small.truth.in_use_ips()
    assert small_store.resource_version == big_store.resource_version


@pytest.mark.parametrize(
    ("phase", "ips", "reason", "annotations"),
    [
        ("Running", ["10.64.0.1", "fd00:10::1"], None, None),
        ("Pending", [], None, None),
        ("Failed", ["10.64.0.2"], "Evicted", {ANNOTATION_POD_IPS: "10.64.0.2/32"}),
        ("Succeeded", ["10.64.0.3"], None, {"cni.projectcalico.org/podIP": ""}),
    ],
)
def test_pod_object_keeps_what_the_collectors_read(
    phase: str, ips: list[str], reason: str | None, annotations: dict[str, str] | None
) -> None:
    small = pod_object("ns", "web-0", "node-1", ips, phase, reason, annotations)
    for size in ("real", "large"):
        big = pod_object(
            "ns", "web-0", "node-1", ips, phase, reason, annotations, size=pod_size(size), seed=2
        )
        assert parse_pod(big) == parse_pod(small)
        assert slimpods.pod(orjson.dumps(big)) == slimpods.pod(orjson.dumps(small))
        assert "hostNetwork" not in big["spec"] and "deletionTimestamp" not in big["metadata"]


def test_a_real_pod_looks_like_a_deployments() -> None:
    pod = pod_object(
        "shop", "pod-0000001", "node-1", ["10.64.0.1"], size="real", seed=1, container_id="ab" * 32
    )
    meta, spec, status = pod["metadata"], pod["spec"], pod["status"]
    assert [r["kind"] for r in meta["ownerReferences"]] == ["ReplicaSet"]
    assert meta["labels"]["pod-template-hash"] and "app.kubernetes.io/name" in meta["labels"]
    assert meta["annotations"]["cni.projectcalico.org/containerID"] == "ab" * 32
    assert {"kubectl.kubernetes.io/restartedAt", "prometheus.io/scrape"} <= meta["annotations"].keys()
    assert [m["manager"] for m in meta["managedFields"]] == [
        "kube-controller-manager",
        "kube-scheduler",
        "calico",
        "kubelet",
    ]
    assert len(spec["containers"]) == 2
    for c in spec["containers"]:
        assert {"env", "resources", "volumeMounts", "readinessProbe", "ports"} <= c.keys()
    kinds = {k for v in spec["volumes"] for k in v if k != "name"}
    assert {"projected", "configMap", "emptyDir"} <= kinds
    assert spec["tolerations"] and spec["affinity"]["nodeAffinity"]
    assert {c["type"] for c in status["conditions"]} >= {"Ready", "PodScheduled"}
    assert [s["name"] for s in status["containerStatuses"]] == [c["name"] for c in spec["containers"]]
    # Deterministic: the same seed and name give the same bytes; a launcher pod has no owner.
    again = pod_object(
        "shop", "pod-0000001", "node-1", ["10.64.0.1"], size="real", seed=1, container_id="ab" * 32
    )
    assert orjson.dumps(again) == orjson.dumps(pod)
    launcher = pod_object("vms", "virt-launcher-db-x", "node-1", ["10.64.0.9"], size="real", launcher=True)
    assert "ownerReferences" not in launcher["metadata"]


def test_on_a_real_server_the_actors_name_their_field_managers() -> None:
    """Through `RestStore` (the actors on a real kube-apiserver) the server keeps its own managedFields: the
    body carries none, and each write names its manager (`fieldManager`)."""
    store = Store(seed=1)
    with SimApiServer(store) as server:
        rest = RestStore(server.url, "unused", None)
        try:
            sim = SimCluster(rest, seed=1, pod_size="real")  # type: ignore[arg-type]
            sim.bootstrap()
            sim.bulk_populate(1, 2)
            sim.create_pod("ns-0", "web-0", "node-00000")
        finally:
            rest.close()
        writes = [r for r in server.requests if r.resource == "pods" and r.method in ("POST", "PUT")]
    managers = {(r.method, r.subresource, r.query.get("fieldManager")) for r in writes}
    assert managers == {("POST", None, "kube-controller-manager"), ("PUT", "status", "kubelet")}
    for pod in store.list("pods")["items"]:
        assert "managedFields" not in pod["metadata"]
        assert pod["spec"]["containers"][0]["env"]  # the rest of the real pod went through


def test_an_unknown_pod_size_is_one_line_and_status_2() -> None:
    bad = CliRunner().invoke(cli, ["sim", "serve", "--pod-size", "bogus"])
    assert bad.exit_code == 2
    said = [line for line in bad.output.splitlines() if "--pod-size" in line]
    assert len(said) == 1 and "'bogus' is not one of 'small', 'real', 'large'" in said[0], bad.output
    for command in (["demo"], ["up"]):
        assert CliRunner().invoke(cli, [*command, "--pod-size", "bogus"]).exit_code == 2
    assert sim_options(2, 3, 0.0, 0.0, 1, "real")[-2:] == ["--pod-size", "real"]  # up's simulated cluster
    assert build_parser().parse_args(["--pod-size", "large"]).pod_size == "large"
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["--pod-size", "bogus"])
    assert exc.value.code == 2
    with pytest.raises(ValueError, match="expected one of small, real, large"):
        pod_size("medium")


def test_up_offers_the_sizes_the_simulated_cluster_has() -> None:
    """`ipamgc up` names the sizes it passes to `ipamgc sim serve` itself (the product does not import the
    lab): they are the lab's, in the same order, with the same help."""
    assert SIM_POD_SIZES == POD_SIZES
    assert SIM_POD_SIZE_HELP == POD_SIZE_HELP
