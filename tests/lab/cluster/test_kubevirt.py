"""The simulated cluster's KubeVirt: a VM keeps its IP across a restart and a live migration (as Calico's
CNI does), leaks what it says (a VM deleted without CNI DEL, a VM deleted with its lost node) and says so in
the ground truth; `sim serve --snapshot` serves kubevirt.io when the snapshot holds VMs; and `--vms`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from lab.apiserver.resources import KUBEVIRT_RESOURCES
from lab.apiserver.store import Store
from lab.cluster.cluster import SimCluster
from lab.cluster.kubevirt import KubeVirt
from lab.commands.sim import load_snapshot
from shared import blockops


def _owners(store: Store, handle: str) -> list[tuple[str, dict[str, str], dict[str, str] | None]]:
    out = []
    for raw in store.list("ipamblocks")["items"]:
        spec = raw["spec"]
        for o, idx in enumerate(spec["allocations"]):
            if idx is not None and spec["attributes"][idx].get("handle_id") == handle:
                attr = spec["attributes"][idx]
                out.append((blockops.ip_of(spec, o), attr["secondary"], attr.get("alternateOwnerAttrs")))
    return out


def _sim() -> tuple[SimCluster, KubeVirt]:
    store = Store(seed=5)
    store.serve(KUBEVIRT_RESOURCES)
    sim = SimCluster(store, seed=5)
    sim.bootstrap()
    for n in ("node-a", "node-b", "node-c"):
        sim.add_node(n)
    return sim, KubeVirt(sim)


def test_a_vm_keeps_its_ip_across_a_restart_and_a_live_migration() -> None:
    sim, kv = _sim()
    vm = kv.create_vm("vms", "db", "node-a")
    [(ip, attrs, alternate)] = _owners(sim.store, vm.handle)
    assert vm.ips == [ip] and attrs["node"] == "node-a" and attrs["vmi-name"] == "db" and alternate is None
    assert attrs["vm-uid"] and attrs["vmi-uid"]
    first_uid = attrs["vmi-uid"]

    kv.restart_vm("vms", "db", "node-b")
    [(ip2, attrs, _)] = _owners(sim.store, vm.handle)
    assert ip2 == ip and attrs["node"] == "node-b" and attrs["vmi-uid"] != first_uid
    assert attrs["pod"] == kv.vms[("vms", "db")].launcher
    assert sim.store.get("pods", "vms", attrs["pod"])["spec"]["nodeName"] == "node-b"
    assert sim.store.get("virtualmachineinstances", "vms", "db")["status"]["nodeName"] == "node-b"

    kv.migrate_vm("vms", "db", "node-c")
    [(ip3, attrs, alternate)] = _owners(sim.store, vm.handle)
    assert ip3 == ip and attrs["node"] == "node-c" and attrs["vmim-uid"] and alternate is None
    assert sim.store.get("virtualmachineinstances", "vms", "db")["status"]["nodeName"] == "node-c"
    handle = sim.store.get("ipamhandles", None, vm.handle)
    assert sum(handle["spec"]["block"].values()) == 1  # still one IP on the handle
    assert sim.truth.leaked_ips() == set() and sim.truth.violations == []


def test_a_node_lost_under_vms_leaks_the_deleted_ones_and_not_the_restarted_ones() -> None:
    sim, kv = _sim()
    gone = kv.create_vm("vms", "gone", "node-a")
    moved = kv.create_vm("vms", "moved", "node-b")
    leaked = kv.lose_node("node-a")
    assert leaked == gone.ips
    assert set(gone.ips) <= sim.truth.leaked_ips()
    assert kv.lose_node("node-b", delete_vms=False, move_to="node-c") == []
    assert not set(moved.ips) & sim.truth.leaked_ips()
    [(ip, attrs, _)] = _owners(sim.store, moved.handle)
    assert ip == moved.ips[0] and attrs["node"] == "node-c"


def test_a_snapshot_with_vms_makes_the_store_serve_kubevirt(tmp_path: Path) -> None:
    sim, kv = _sim()
    kv.create_vm("vms", "db", "node-a")
    path = tmp_path / "snap.json"
    path.write_bytes(orjson.dumps(sim.export()))
    store = Store(seed=1)
    assert not store.serves("virtualmachines")
    assert load_snapshot(store, str(path)) > 0
    assert [o["metadata"]["name"] for o in store.list("virtualmachines")["items"]] == ["db"]
    assert [o["metadata"]["name"] for o in store.list("virtualmachineinstances")["items"]] == ["db"]


def test_sim_serve_kubevirt_makes_vms(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    proc = subprocess.Popen(
        [sys.executable, "-m", "ipamgc", "sim", "serve", "--nodes", "2", "--pods-per-node", "1", "--kubevirt",
         "--vms", "3", "--kubeconfig-out", str(kubeconfig), "--duration", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().decode().startswith("http://127.0.0.1:")
        with k8s_config.new_client_from_config(str(kubeconfig)) as api:
            crd = k8s.CustomObjectsApi(api)
            vms = crd.list_cluster_custom_object("kubevirt.io", "v1", "virtualmachines")
            assert len(vms["items"]) == 3
    finally:
        proc.terminate()
        proc.communicate(timeout=10)
