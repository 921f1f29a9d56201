"""The read-only ClusterRole for `ipamgc check --kubeconfig` (deploy/rbac.yaml `ipamgc-check`), proven both
ways as tests/deploy/test_rbac.py does for the components: the real command runs against the simulated
API server (one serving Calico's objects in crd.projectcalico.org/v1, one in projectcalico.org/v3), and
every request it made is granted by the role, and every rule of the role was used; the role lists only
(nothing it grants can change the cluster)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from lab.apiserver.apiserver import SimApiServer
from lab.apiserver.resources import KUBEVIRT_RESOURCES, resources_for
from lab.apiserver.store import Store
from lab.cluster.cluster import SimCluster
from lab.cluster.kubevirt import KubeVirt
from shared.calicogroup import GROUPS
from tests.deploy.conftest import Obj, find
from tests.deploy.test_rbac import Call, Grant, call_of, check
from tests.fixtures.stack import ROOT

READ_ONLY = {"get", "list", "watch"}


def role_grants(objs: list[Obj], name: str) -> list[Grant]:
    [role] = find(objs, "ClusterRole", name)
    return [
        Grant(
            tuple(tuple(r.get(k) or ()) for k in ("apiGroups", "resources", "verbs", "resourceNames")),  # type: ignore[arg-type]
            None,
        )
        for r in role["rules"]
    ]


def test_the_check_role_grants_exactly_what_check_reads(manifests: list[Obj], tmp_path: Path) -> None:
    calls: set[Call] = set()
    for group in GROUPS:
        store = Store(resources_for(group), seed=3)
        with SimApiServer(store) as server:
            sim = SimCluster(store, seed=3)
            sim.bootstrap("15m")
            sim.populate(nodes=2, pods_per_node=3)
            store.serve(KUBEVIRT_RESOURCES)  # with KubeVirt: its VMs and VMIs are listed too
            KubeVirt(sim).create_vm("vms", "db", "node-00000")
            kubeconfig = server.write_kubeconfig(tmp_path / f"kubeconfig-{group.version}")
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "ipamgc",
                    "check",
                    "--kubeconfig",
                    str(kubeconfig),
                    "--output",
                    "json",
                ],
                check=False,
                cwd=ROOT,
                capture_output=True,
                timeout=60,
            )
            assert done.returncode == 0, done.stderr.decode(errors="replace")
            report = json.loads(done.stdout)
            # the pods' IPs, two tunnel IPs and the VM's IP
            assert report["summary"]["allocations"] == 2 * 3 + 2 + 1
            assert report["summary"]["leaked"] == 0
            calls |= {c for r in server.requests if (c := call_of(r)) is not None}
    granted = role_grants(manifests, "ipamgc-check")
    check("check", calls, granted)
    assert all(set(g.rule[2]) <= READ_ONLY for g in granted)
    # Bound to no one by default: the operator binds it to whoever audits (README).
    bound = [b["roleRef"]["name"] for b in find(manifests, "ClusterRoleBinding")]
    assert "ipamgc-check" not in bound
