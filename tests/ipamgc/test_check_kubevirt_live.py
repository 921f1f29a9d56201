"""`ipamgc check --kubeconfig` discovers KubeVirt: a cluster that serves kubevirt.io/v1 has its VMs and VMIs
read (and its VM IPs judged by them); one that does not keeps every VM IP (`kubevirt-absent`).  Over real
HTTP against the simulated cluster; `ipamgc sim export` writes the same objects."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ipamgc.cli import cli
from lab.apiserver.apiserver import SimApiServer
from lab.apiserver.resources import KUBEVIRT_RESOURCES
from lab.apiserver.store import Store
from lab.cluster.cluster import SimCluster
from lab.cluster.kubevirt import KubeVirt


@pytest.mark.parametrize("installed", [True, False])
def test_check_kubeconfig_discovers_kubevirt(tmp_path: Path, installed: bool) -> None:
    store = Store(seed=3)
    with SimApiServer(store) as server:
        sim = SimCluster(store, seed=3)
        sim.bootstrap()
        sim.add_node("node-a")
        sim.create_pod("default", "web-0", "node-a")
        store.serve(KUBEVIRT_RESOURCES)
        kv = KubeVirt(sim)
        kept = kv.create_vm("vms", "kept", "node-a")
        leaked = kv.leak_vm_deleted_without_cni_del("vms", kv.create_vm("vms", "gone", "node-a").name)
        if not installed:
            store.unserve(("virtualmachines", "virtualmachineinstances"))
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        result = CliRunner().invoke(cli, ["check", "--kubeconfig", str(kubeconfig), "--output", "json"])
        assert result.exit_code == 0, result.output
        rows = {a["ip"]: a["reason"] for a in json.loads(result.stdout)["allocations"]}
        expected = ("vm-exists", "vm-missing") if installed else ("kubevirt-absent", "kubevirt-absent")
        assert (rows[kept.ips[0]], rows[leaked[0]]) == expected

        out = tmp_path / "export.json"
        done = CliRunner().invoke(
            cli, ["sim", "export", "--kubeconfig", str(kubeconfig), "--output-file", str(out)]
        )
        assert done.exit_code == 0, done.output
        kinds = {i["kind"] for i in json.loads(out.read_text())["items"]}
        assert ({"VirtualMachine", "VirtualMachineInstance"} <= kinds) is installed
