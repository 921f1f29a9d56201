"""The read-only ClusterRole for `ipamgc check --kubeconfig` (deploy/rbac.yaml `ipamgc-check`), proven both
ways as tests/deploy/test_rbac.py does for the components: the real command runs against the simulated
API server, and every request it made is granted by the role, and every rule of the role was used; the
role lists only (nothing it grants can change the cluster)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ipamgc.sim.apiserver import SimApiServer
from ipamgc.sim.cluster import SimCluster
from ipamgc.sim.kubevirt import KubeVirt
from ipamgc.sim.resources import KUBEVIRT_RESOURCES
from tests.deploy.conftest import Obj, find
from tests.deploy.test_rbac import Call, Grant, call_of, check
from tests.e2e import conftest as e2e
from tests.e2e.conftest import ROOT

server = e2e.server  # fixtures
sim = e2e.sim

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


def test_the_check_role_grants_exactly_what_check_reads(
    manifests: list[Obj],
    server: SimApiServer,
    sim: SimCluster,
    tmp_path: Path,
) -> None:
    sim.bootstrap("15m")
    sim.populate(nodes=2, pods_per_node=3)
    server.store.serve(KUBEVIRT_RESOURCES)  # with KubeVirt: its VMs and VMIs are listed too
    KubeVirt(sim).create_vm("vms", "db", "node-00000")
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
    done = subprocess.run(
        [sys.executable, "-m", "ipamgc", "check", "--kubeconfig", str(kubeconfig), "--output", "json"],
        check=False,
        cwd=ROOT,
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    calls: set[Call] = {c for r in server.requests if (c := call_of(r)) is not None}
    granted = role_grants(manifests, "ipamgc-check")
    check("check", calls, granted)
    assert all(set(g.rule[2]) <= READ_ONLY for g in granted)
    # Bound to no one by default: the operator binds it to whoever audits (README).
    bound = [b["roleRef"]["name"] for b in find(manifests, "ClusterRoleBinding")]
    assert "ipamgc-check" not in bound
