"""Is Calico's own collector still collecting (ipamgc/calicoswitch.py)?  Read from the
KubeControllersConfiguration `default`'s `status.runningConfig` (what calico-kube-controllers runs with),
beside its spec (what someone asked for, which tigera-operator or GitOps may set back); and said by
`ipamgc check --kubeconfig`, on a line of its stderr and in its JSON report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ipamgc.calicoswitch import calico_collector
from ipamgc.cli import cli
from lab.apiserver.apiserver import SimApiServer
from lab.cluster.cluster import SimCluster


def _kcc(spec: str | None, running: str | None, node: bool = True, status: bool = True) -> dict[str, Any]:
    def controllers(grace: str | None) -> dict[str, Any]:
        if not node:
            return {"controllers": {"namespace": {}}}
        return {"controllers": {"node": {} if grace is None else {"leakGracePeriod": grace}}}

    doc: dict[str, Any] = {"metadata": {"name": "default"}, "spec": controllers(spec)}
    if status:
        doc["status"] = {"runningConfig": controllers(running)}
    return doc


@pytest.mark.parametrize(
    ("kcc", "collecting", "says"),
    [
        (
            _kcc("15m0s", "15m0s"),
            True,
            "Calico IS collecting leaks on live nodes (running leakGracePeriod 15m0s)",
        ),
        (_kcc(None, None), False, "Calico collects no leaks on live nodes (running leakGracePeriod unset)"),
        (_kcc("0s", "0s"), False, "Calico confirms no leak on live nodes (running leakGracePeriod 0s)"),
        (_kcc(None, None, node=False), False, "Calico's node controller is off: it collects nothing"),
        # the spec edited, the running configuration not (yet): the status is what counts
        (
            _kcc(None, "15m0s"),
            True,
            "Calico IS collecting leaks on live nodes (running leakGracePeriod 15m0s); the spec says unset: "
            "not applied yet, or set back by tigera-operator or GitOps",
        ),
        (
            _kcc("15m0s", None, status=False),
            None,
            "KubeControllersConfiguration default has no status.runningConfig: calico-kube-controllers is "
            "not running, or older (spec.leakGracePeriod: 15m0s)",
        ),
    ],
)
def test_what_calicos_collector_does(kcc: dict[str, Any], collecting: bool | None, says: str) -> None:
    state = calico_collector([{"metadata": {"name": "other"}}, kcc])
    assert (state.collecting, state.line) == (collecting, says)


def test_no_configuration_means_calico_creates_one_and_collects() -> None:
    state = calico_collector([])
    assert state.collecting is None and "creates one with leakGracePeriod 15m" in state.line


def test_check_says_whether_calico_collects(server: SimApiServer, tmp_path: Path) -> None:
    sim = SimCluster(server.store, seed=3)
    sim.bootstrap(leak_grace_period=None)  # the switch done: the spec's leakGracePeriod removed
    sim.populate(nodes=1, pods_per_node=1)
    kcc = server.store.get("kubecontrollersconfigurations", None, "default")
    # … but calico-kube-controllers still runs with the old value (not restarted, or the operator won)
    kcc["status"] = {"runningConfig": {"controllers": {"node": {"leakGracePeriod": "15m0s"}}}}
    server.store.replace("kubecontrollersconfigurations", None, "default", kcc, subresource="status")
    kubeconfig = str(server.write_kubeconfig(tmp_path / "kubeconfig"))
    done = CliRunner().invoke(cli, ["check", "--kubeconfig", kubeconfig, "--output", "json"])
    assert done.exit_code == 0, done.output
    assert (
        "ipamgc check: Calico's collector: Calico IS collecting leaks on live nodes (running leakGracePeriod "
        "15m0s); the spec says unset: not applied yet, or set back by tigera-operator or GitOps"
    ) in done.stderr
    report = json.loads(done.stdout)
    assert report["calico_collector"] == {
        "collecting": True,
        "running": "15m0s",
        "spec": "",
        "says": report["calico_collector"]["says"],
    }
