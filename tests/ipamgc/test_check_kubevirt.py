"""`ipamgc check` and KubeVirt: VMs and VMIs read from the snapshot (KubeVirt installed when it holds any),
`--kubevirt` / `--no-kubevirt` saying so explicitly, unreadable ones keeping their VMs' IPs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
from click.testing import CliRunner

from ipamgc.cli import cli
from lab.cluster.kubevirt import vm_object, vmi_object
from lab.cluster.objects import ClusterBuilder

NS = "vms"


def _vm_ip(cb: ClusterBuilder, vm: str, node: str) -> str:
    attrs = {"node": node, "namespace": NS, "pod": f"virt-launcher-{vm}-x", "vmi-name": vm, "vmi-uid": "u"}
    return cb.ipam.assign(node, f"k8s-pod-network.vmi.{NS}.{vm}", attrs)


def _cluster() -> tuple[ClusterBuilder, dict[str, str], list[dict[str, Any]]]:
    cb = ClusterBuilder()
    cb.add_node("node-1")
    cb.add_node("node-2")
    cb.add_pod("default", "web-0", "node-1")
    ips = {
        "running": _vm_ip(cb, "running", "node-1"),
        "bare": _vm_ip(cb, "bare", "node-1"),
        "orphan": _vm_ip(cb, "orphan", "node-1"),
        "deleted": _vm_ip(cb, "deleted", "node-1"),
        "lost": _vm_ip(cb, "lost", "node-2"),
    }
    kubevirt = [
        vm_object(NS, "running"),
        vmi_object(NS, "running", "node-1", owned=True),
        vmi_object(NS, "bare", "node-1", owned=False),
        vmi_object(NS, "orphan", "node-1", owned=True),  # its VM is gone
    ]
    cb.delete_node("node-2")
    return cb, ips, kubevirt


def _check(tmp_path: Path, items: list[dict[str, Any]], *flags: str) -> tuple[dict[str, Any], str]:
    path = tmp_path / "snapshot.json"
    path.write_bytes(orjson.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    result = CliRunner().invoke(cli, ["check", "--snapshot", str(path), "--output", "json", *flags])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout), result.stderr


def _verdicts(doc: dict[str, Any], ips: dict[str, str]) -> dict[str, tuple[str, str]]:
    rows = {a["ip"]: a for a in doc["allocations"]}
    return {role: (rows[ip]["reason"], rows[ip]["release"]) for role, ip in ips.items()}


def test_a_snapshot_with_kubevirt_objects_is_judged_by_the_vm_rule(tmp_path: Path) -> None:
    cb, ips, kubevirt = _cluster()
    doc, _ = _check(tmp_path, [*cb.snapshot()["items"], *kubevirt])
    assert _verdicts(doc, ips) == {
        "running": ("vm-exists", "never"),
        "bare": ("vmi-standalone", "never"),
        "orphan": ("vm-missing", "after-grace"),  # a VMI owned by a deleted VM does not count
        "deleted": ("vm-missing", "after-grace"),
        "lost": ("vm-missing", "now"),  # its node is gone: at once
    }


def test_kubevirt_flags_say_so_explicitly(tmp_path: Path) -> None:
    cb, ips, kubevirt = _cluster()
    doc, _ = _check(tmp_path, [*cb.snapshot()["items"], *kubevirt], "--no-kubevirt")
    assert set(_verdicts(doc, ips).values()) == {("kubevirt-absent", "never")}
    doc, _ = _check(tmp_path, cb.snapshot()["items"])  # no kubevirt.io object: not installed
    assert set(_verdicts(doc, ips).values()) == {("kubevirt-absent", "never")}
    doc, _ = _check(tmp_path, cb.snapshot()["items"], "--kubevirt")  # installed, with no VM at all
    assert {role: v[0] for role, v in _verdicts(doc, ips).items()} == dict.fromkeys(ips, "vm-missing")


def test_an_unreadable_vmi_keeps_its_vms_ip(tmp_path: Path) -> None:
    cb, ips, kubevirt = _cluster()
    bad = vmi_object(NS, "deleted", "node-1", owned=True)
    bad["metadata"]["ownerReferences"] = "not a list"
    doc, err = _check(tmp_path, [*cb.snapshot()["items"], *kubevirt, bad])
    assert _verdicts(doc, ips)["deleted"] == ("vm-unknown", "never")
    assert "skipped VirtualMachineInstance/vms/deleted" in err
    nameless = vm_object(NS, "x")
    del nameless["metadata"]["name"]
    doc, _ = _check(tmp_path, [*cb.snapshot()["items"], *kubevirt, nameless])
    assert set(_verdicts(doc, ips).values()) == {("vm-unknown", "never")}  # which VM is unknown: every one
