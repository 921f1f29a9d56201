"""The chart with `combined: true`: one Deployment runs `ipamgc combined` (watcher, worker and leader in
one process) with flags and environment the command reads, under the watcher's ServiceAccount bound to the
leader's roles too; the workers' and the leader's Deployments (and the workers' HPA) are not rendered."""

from __future__ import annotations

import click

from ipamgc.commands.combined import combined
from tests.deploy.conftest import Obj, find
from tests.deploy.test_helm import ALL_VALUES, CI_VALUES, HERE, render

COMBINED_VALUES = HERE / "combined-values.yaml"


def _container(objs: list[Obj]) -> Obj:
    [deployment] = find(objs, "Deployment")
    assert deployment["metadata"]["name"] == "ipamgc-watcher"
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert isinstance(container, dict)
    return container


def _env(container: Obj) -> dict[str, Obj]:
    return {e["name"]: e for e in container["env"]}


def _envvars(command: click.Command) -> set[str]:
    names: set[str] = set()
    for p in command.params:
        if isinstance(p, click.Option) and p.envvar:
            names |= {p.envvar} if isinstance(p.envvar, str) else set(p.envvar)
    return names


def test_one_deployment_runs_combined_with_flags_it_takes() -> None:
    objs = render(CI_VALUES, COMBINED_VALUES)
    assert not find(objs, "HorizontalPodAutoscaler")
    container = _container(objs)
    args = container["args"]
    assert args[0] == "combined"
    ctx = combined.make_context("combined", args[1:])  # every flag the chart passes exists
    assert ctx.params["lease_name"] == "ipamgc-watcher"
    assert ctx.params["leader_lease_name"] == "ipamgc-leader"
    env = _env(container)
    for component in ("worker", "leader"):
        var = f"IPAMGC_{component.upper()}_REDIS_URL"
        assert var in _envvars(combined)
        ref = env[var]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": f"ipamgc-redis-{component}", "key": "url"}
    assert env["REDIS_URL"]["valueFrom"]["secretKeyRef"]["name"] == "ipamgc-redis-watcher"


def test_the_watchers_account_holds_the_leaders_roles() -> None:
    objs = render(CI_VALUES, COMBINED_VALUES)
    watcher_sa = {"kind": "ServiceAccount", "name": "ipamgc-watcher", "namespace": "ipamgc"}
    for kind, name in (("ClusterRoleBinding", "ipamgc-leader"), ("RoleBinding", "ipamgc-leader-lease")):
        [binding] = find(objs, kind, name)
        assert watcher_sa in binding["subjects"], (kind, name)
    # Without `combined`, the watcher's account has none of the leader's.
    for kind, name in (("ClusterRoleBinding", "ipamgc-leader"), ("RoleBinding", "ipamgc-leader-lease")):
        [binding] = find(render(CI_VALUES), kind, name)
        assert watcher_sa not in binding["subjects"]


def test_the_leaders_values_reach_the_combined_process() -> None:
    objs = render(CI_VALUES, ALL_VALUES, COMBINED_VALUES, sets=("leader.rateLimit=20",))
    container = _container(objs)
    ctx = combined.make_context("combined", container["args"][1:])
    assert ctx.params["dry_run"] and ctx.params["no_handle_gc"]
    env = _env(container)
    assert env["IPAMGC_RATE_LIMIT"]["value"] == "20"
    assert env["IPAMGC_LEAK_GRACE_PERIOD"]["value"] == "90s"
