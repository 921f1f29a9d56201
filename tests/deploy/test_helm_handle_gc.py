"""The chart's `handleGC` value (docs/handles.md): on by default, `false` passes `--no-handle-gc` to the
leader only; and the leader's role lets it list and create IPAMHandles (the collector's scan and its
repair of a missing handle), never create a block."""

from __future__ import annotations

from typing import Any

from tests.deploy.conftest import find
from tests.deploy.test_helm import ALL_VALUES, CI_VALUES, render


def _args(objs: list[Any], name: str) -> list[str]:
    [deployment] = find(objs, "Deployment", name)
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return list(container.get("args") or [])


def test_the_handle_collector_is_on_by_default_and_off_on_the_leader_only() -> None:
    objs = render(CI_VALUES)
    assert "--no-handle-gc" not in _args(objs, "ipamgc-leader")
    off = render(CI_VALUES, ALL_VALUES)
    assert "--no-handle-gc" in _args(off, "ipamgc-leader")
    for other in ("ipamgc-watcher", "ipamgc-worker"):
        assert "--no-handle-gc" not in _args(off, other)


def test_the_leader_may_list_and_create_handles_and_never_create_blocks() -> None:
    objs = render(CI_VALUES)
    [role] = [r for r in find(objs, "ClusterRole") if r["metadata"]["name"] == "ipamgc-leader"]
    verbs: dict[str, set[str]] = {}
    for rule in role["rules"]:
        if "projectcalico.org" in rule["apiGroups"]:
            for resource in rule["resources"]:
                verbs.setdefault(resource, set()).update(rule["verbs"])
    assert verbs["ipamhandles"] == {"get", "list", "create", "update", "delete"}
    assert verbs["ipamblocks"] == {"get", "list", "update", "delete"}
