"""`ipamgc sim serve --calico-api-group projectcalico.org/v3` serves Calico's objects in that group only, and
a `--snapshot` of either group loads into either; `ipamgc check` reads snapshots of either group and a
live cluster of either group with the same verdicts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
from click.testing import CliRunner
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from ipamgc.cli import cli
from lab.apiserver.apiserver import SimApiServer
from lab.apiserver.resources import resources_for
from lab.apiserver.store import Store
from lab.commands.sim import load_snapshot
from shared.calicogroup import V1, V3, CalicoGroup

SNAPSHOT = "examples/leaks.json"  # crd.projectcalico.org/v1 objects


def _served(store: Store, tmp_path: Path, name: str) -> tuple[dict[str, Any], Path]:
    """`check --kubeconfig` on the store served over HTTP, and its `sim export` written to a file."""
    runner = CliRunner()
    with SimApiServer(store) as server:
        kubeconfig = server.write_kubeconfig(tmp_path / f"{name}.kubeconfig")
        exported = tmp_path / f"{name}.json"
        result = runner.invoke(
            cli, ["sim", "export", "--kubeconfig", str(kubeconfig), "--output-file", str(exported)]
        )
        assert result.exit_code == 0, result.output
        live = runner.invoke(cli, ["check", "--kubeconfig", str(kubeconfig), "-o", "json"])
        assert live.exit_code == 0, live.output
    doc: dict[str, Any] = orjson.loads(live.stdout)
    doc.pop("report")
    # Live only: whether Calico's own collector still collects (the snapshot holds no running config).
    assert "collecting" in doc.pop("calico_collector")
    return doc, exported


def _check_snapshot(path: str | Path) -> dict[str, Any]:
    result = CliRunner().invoke(cli, ["check", "--snapshot", str(path), "-o", "json"])
    assert result.exit_code == 0, result.output
    doc: dict[str, Any] = orjson.loads(result.stdout)
    doc.pop("report")
    return doc


def _calico_items(path: Path) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = orjson.loads(path.read_bytes())["items"]
    return [i for i in items if i["kind"] not in ("Node", "Pod")]


def _store(group: CalicoGroup, snapshot: str | Path) -> Store:
    store = Store(resources_for(group), seed=0)
    assert load_snapshot(store, str(snapshot)) > 0
    return store


def test_snapshots_of_either_group_load_into_either_and_audit_alike(tmp_path: Path) -> None:
    expected = _check_snapshot(SNAPSHOT)
    assert expected["summary"]["leaked"] == 7

    # A v1 snapshot served as projectcalico.org/v3: the same verdicts, live and exported.
    v3_store = _store(V3, SNAPSHOT)
    live_v3, exported_v3 = _served(v3_store, tmp_path, "v3")
    assert live_v3 == expected
    items = _calico_items(exported_v3)
    assert items and {i["apiVersion"] for i in items} == {V3.api_version}
    affinities = [i for i in items if i["kind"] == "BlockAffinity"]
    assert affinities and all(isinstance(a["spec"]["deleted"], bool) for a in affinities)
    # `check --snapshot` reads the v3 export as it reads the v1 file.
    assert _check_snapshot(exported_v3) == expected

    # And back: the v3 export served as crd.projectcalico.org/v1 (strings again).
    v1_store = _store(V1, exported_v3)
    live_v1, exported_v1 = _served(v1_store, tmp_path, "v1")
    assert live_v1 == expected
    affinities = [i for i in _calico_items(exported_v1) if i["kind"] == "BlockAffinity"]
    assert affinities and all(a["spec"]["deleted"] in ("true", "false") for a in affinities)
    assert {i["apiVersion"] for i in _calico_items(exported_v1)} == {V1.api_version}


def test_an_ipam_config_of_either_group_loads_as_the_served_group_has_it(tmp_path: Path) -> None:
    snapshot = tmp_path / "config.json"
    config = {"apiVersion": V1.api_version, "kind": "IPAMConfig", "metadata": {"name": "default"}}
    config["spec"] = {"ipCooldownSeconds": 30}
    snapshot.write_bytes(orjson.dumps({"apiVersion": "v1", "kind": "List", "items": [config]}))
    stored = _store(V3, snapshot).get("ipamconfigurations", None, "default")
    assert (stored["apiVersion"], stored["kind"], stored["spec"]) == (
        V3.api_version,
        "IPAMConfiguration",
        {"ipCooldownSeconds": 30},
    )
    v3 = tmp_path / "config-v3.json"
    v3.write_bytes(orjson.dumps({"apiVersion": "v1", "kind": "List", "items": [stored]}))
    assert _store(V1, v3).get("ipamconfigs", None, "default")["kind"] == "IPAMConfig"


def test_sim_serve_serves_the_group_it_is_told_only(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    proc = subprocess.Popen(
        [sys.executable, "-m", "ipamgc", "sim", "serve", "--nodes", "2", "--pods-per-node", "2",
         "--calico-api-group", "projectcalico.org/v3", "--kubeconfig-out", str(kubeconfig),
         "--duration", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().decode().startswith("http://127.0.0.1:")
        with k8s_config.new_client_from_config(str(kubeconfig)) as api:
            groups = {g.name for g in k8s.ApisApi(api).get_api_versions().groups}
            assert "projectcalico.org" in groups and "crd.projectcalico.org" not in groups
            crd = k8s.CustomObjectsApi(api)
            config = crd.get_cluster_custom_object("projectcalico.org", "v3", "ipamconfigurations", "default")
            assert config["kind"] == "IPAMConfiguration"
            blocks = crd.list_cluster_custom_object("projectcalico.org", "v3", "ipamblocks")["items"]
            assert len(blocks) == 2
    finally:
        proc.terminate()
        proc.communicate(timeout=10)
    bad = CliRunner().invoke(cli, ["sim", "serve", "--calico-api-group", "projectcalico.org/v2"])
    assert bad.exit_code == 2
    assert "expected projectcalico.org/v3 or crd.projectcalico.org/v1" in bad.output
