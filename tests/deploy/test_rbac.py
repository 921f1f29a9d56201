"""Least privilege, proven both ways: run the watcher and the leader against the simulated API server through
everything they do (lists and watches, the Leases, releases of IPs, of an empty block and of a deleted
node's blocks and affinities, the IPPool listing of the metrics), once on a cluster serving Calico's
objects in crd.projectcalico.org/v1 and once on one serving them in projectcalico.org/v3, collect the
(verb, group, resource, namespace, name) of every request from the servers' logs, and check that
deploy/rbac.yaml grants each one to the component's ServiceAccount — and that every rule it grants was
used."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from lab.apiserver.apiserver import RequestRecord
from lab.apiserver.resources import KUBEVIRT_RESOURCES
from lab.cluster.kubevirt import KubeVirt
from producer.kubevirt import KINDS as KUBEVIRT_KINDS
from shared.calicogroup import GROUPS
from shared.clock import FakeClock
from shared.config import Settings
from shared.keys import Keys
from shared.names import handle_name
from tests.deploy.conftest import Obj, find
from tests.fixtures.leader import GRACE, Env, leader_env
from tests.fixtures.redis import Endpoint
from tests.fixtures.stack import fast_settings
from tests.fixtures.watcher_metrics import watcher_with_metrics
from tests.polling import wait_until
from workers.leader.loop import run_leader
from workers.leader.settings import LeaderSettings

NAMESPACE = "ipamgc"  # where deploy/ runs the components
TEST_NAMESPACE = "default"  # the Lease namespace used here: it stands for the pod's namespace
COMPONENT_OF_SA = {"ipamgc-watcher": "watcher", "ipamgc-leader": "leader"}


@dataclass(frozen=True, slots=True)
class Call:
    verb: str
    group: str
    resource: str
    namespace: str | None
    name: str | None


@dataclass(frozen=True, slots=True)
class Grant:
    rule: tuple[
        tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[str, ...]
    ]  # groups, res, verbs, names
    namespace: str | None  # None: cluster-wide (ClusterRoleBinding)

    def allows(self, c: Call) -> bool:
        groups, resources, verbs, names = self.rule
        if self.namespace is not None and c.namespace != self.namespace:
            return False
        if names and (c.name not in names or c.verb in ("create", "list", "watch")):
            return False
        return c.group in groups and c.resource in resources and c.verb in verbs

    def uses(self) -> set[tuple[str, str, str, str | None]]:
        """Every (group, resource, verb, name) this grant stands for."""
        groups, resources, verbs, names = self.rule
        return {(g, r, v, n) for g in groups for r in resources for v in verbs for n in (names or (None,))}


def call_of(r: RequestRecord) -> Call | None:
    if r.resource is None or r.verb in ("discovery", "health", "unknown"):
        return None
    parts = [p for p in r.path.split("/") if p]
    group = "" if parts[0] == "api" else parts[1]
    namespace = NAMESPACE if r.namespace == TEST_NAMESPACE else r.namespace
    return Call(r.verb, group, r.resource, namespace, r.name)


def grants(objs: list[Obj], service_account: str) -> list[Grant]:
    """The rules bound to a ServiceAccount of `ipamgc`, with the namespace they apply to."""
    out: list[Grant] = []
    for binding in find(objs, "ClusterRoleBinding") + find(objs, "RoleBinding"):
        subjects = binding.get("subjects") or []
        if not any(s["kind"] == "ServiceAccount" and s["name"] == service_account for s in subjects):
            continue
        ref = binding["roleRef"]
        [role] = find(objs, ref["kind"], ref["name"])
        scope = None if binding["kind"] == "ClusterRoleBinding" else binding["metadata"]["namespace"]
        for rule in role["rules"]:
            key = tuple(
                tuple(rule.get(k) or ()) for k in ("apiGroups", "resources", "verbs", "resourceNames")
            )
            out.append(Grant(key, scope))  # type: ignore[arg-type]
    return out


def check(component: str, calls: set[Call], granted: list[Grant]) -> None:
    assert calls, f"the {component} made no request: the scenario is broken"
    denied = sorted((c for c in calls if not any(g.allows(c) for g in granted)), key=str)
    assert denied == [], f"{component}: requests rbac.yaml does not grant"
    for g in granted:
        assert all("*" not in part for part in g.rule), f"{component}: wildcard in {g.rule}"
        unused = sorted(
            (grp, res, verb, name)
            for grp, res, verb, name in g.uses()
            if not any(
                c.group == grp and c.resource == res and c.verb == verb and (name is None or c.name == name)
                for c in calls
            )
        )
        assert unused == [], f"{component}: granted but never used (not least privilege): {unused}"


def leader_scenario(env: Env) -> None:
    """Releases of every kind, stepped with the fake clock (tests/fixtures/leader.py), on a cluster with
    KubeVirt."""
    sim = env.sim
    env.server.store.serve(KUBEVIRT_RESOURCES)
    kv = KubeVirt(sim)
    for n in ("node-a", "node-b", "node-dead"):
        sim.add_node(n)
    sim.create_pod("ns", "gone", "node-a")
    sim.create_pod("ns", "keep", "node-b")
    sim.create_pod("ns", "dead-1", "node-dead")
    kv.create_vm("vms", "dead-vm", "node-dead")
    sim.empty_block("node-b")  # a live node's second, empty block: released after the grace period
    keep_handle = sim.pod_handles[("ns", "keep")][0]
    env.server.store.delete("ipamhandles", None, handle_name(keep_handle))  # recreated by the leader
    env.decide()
    lead = env.leader(handle_gc=True)
    lead.step()  # the empty block's first observation, the handle collector's first scan
    sim.leak_pod_deleted_without_cni_del("ns", "gone")
    sim.leak_node_deleted("node-dead")
    kv.leak_vm_deleted_without_cni_del("vms", "dead-vm")  # re-checked live: its VM and VMI read
    env.clock.advance(GRACE + 1)
    env.decide()
    env.clock.advance(GRACE + 1)
    env.decide()
    lead.step()  # releases IPs (live node: node and pod read live), the empty block, the dead node
    env.clock.advance(GRACE + 1)
    lead.step()  # the third scan: the missing IPAMHandle created
    results = {(r.result.value, r.rule, bool(r.ip)) for r in env.audit()}
    assert ("released", "empty-block", False) in results
    assert ("released", "node-missing", False) in results
    assert ("released", "pod-missing", True) in results
    assert ("released", "vm-missing", True) in results
    assert ("repaired", "handle-missing", False) in results


def elected_leader(env: Env, url: str, kubeconfig: Path) -> None:
    """The leader process's election: acquire the Lease, lead one term, release it."""
    base = Settings(
        redis_url=url,
        kubeconfig=str(kubeconfig),
        election_namespace=TEST_NAMESPACE,
        election_lease_seconds=3,
        election_renew_seconds=2.0,
        election_retry_seconds=1.0,
    )
    stop = threading.Event()
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(run_leader(LeaderSettings(base=base), stop)))
    thread.start()
    try:
        fence = env.keys.leader("ipamgc-leader")
        wait_until(lambda: env.redis.hget(fence, "epoch") == b"2", timeout=10)  # the scenario's was 1
    finally:
        stop.set()
        thread.join(timeout=20)
    assert codes == [0]


def release_with_the_leaders_account(env: Env, url: str, kubeconfig: Path) -> tuple[float, float]:
    """A deleted node's IP (`check` marks it `release: now`), released by `ipamgc release --from-report`;
    returns when `check` ran (its calls are its own role's, not counted here: nothing else runs then)."""
    from click.testing import CliRunner

    from ipamgc.cli import cli

    env.sim.add_node("node-gone")
    env.sim.create_pod("ns", "late", "node-gone")
    env.sim.leak_node_deleted("node-gone")
    runner = CliRunner()
    check = ["check", "--kubeconfig", str(kubeconfig), "-o", "json"]
    started = time.time()
    checked = runner.invoke(cli, check)
    check_ran = (started, time.time())
    assert checked.exit_code in (0, 1), checked.output
    report = kubeconfig.with_name("report.json")
    report.write_text(checked.stdout)
    args = ["release", "--from-report", str(report), "--kubeconfig", str(kubeconfig), "--redis-url", url]
    released = runner.invoke(cli, args)
    assert released.exit_code == 0, released.output
    assert "released" in released.stderr
    return check_ran


def test_rbac_grants_exactly_what_the_components_use(
    manifests: list[Obj],
    redis_endpoint: Endpoint,
    client: redis.Redis,
    keys: Keys,
    clock: FakeClock,
    tmp_path: Path,
) -> None:
    url = f"redis://{redis_endpoint.host}:{redis_endpoint.port}/0"
    by_component: dict[str, set[Call]] = {"watcher": set(), "leader": set()}
    for group in GROUPS:  # each cluster serves Calico's objects in one group, discovered by both
        client.flushdb()
        with leader_env(client, keys, clock, group) as env:
            server = env.server
            env.sim.bootstrap("15m")
            leader_scenario(env)
            elected_leader(env, url, server.write_kubeconfig(tmp_path / f"kubeconfig-{group.version}"))
            with watcher_with_metrics(server, fast_settings(url, election=True)) as w:
                wait_until(w.watcher.synced.is_set, timeout=15)
                # KubeVirt is served: its VMs and VMIs listed, and watched.
                stats = w.watcher.stats
                wait_until(
                    lambda stats=stats: all(stats.get("watches", k) for k in KUBEVIRT_KINDS),  # type: ignore[misc]
                    timeout=15,
                )
                w.metrics.refresh()
                assert w.metrics.reading is not None and w.metrics.reading.pools
            # `ipamgc release --from-report`, run with the leader's account: a fresh leak, reported by
            # `check` (calls not counted: check has a role of its own), released live.
            check_ran = release_with_the_leaders_account(
                env, url, server.write_kubeconfig(tmp_path / "kc-release")
            )
            # The watcher's stop released its Lease before the context ended.
            calls = [(r, c) for r in server.requests if (c := call_of(r)) is not None]
            assert {c.group for _, c in calls} - {"", "coordination.k8s.io", "kubevirt.io"} == {group.name}
            for r, c in calls:
                if check_ran[0] <= r.timestamp <= check_ran[1]:
                    continue  # `ipamgc check`'s calls (its own role)
                leader = r.user_agent.startswith(("ipamgc-leader/", "ipamgc-release"))
                by_component["leader" if leader else "watcher"].add(c)
    for sa, component in COMPONENT_OF_SA.items():
        check(component, by_component[component], grants(manifests, sa))

    # The workers never call the API: no rule, no token.
    assert grants(manifests, "ipamgc-worker") == []
    [worker_sa] = find(manifests, "ServiceAccount", "ipamgc-worker")
    assert worker_sa["automountServiceAccountToken"] is False
    # Each Deployment runs under the ServiceAccount whose rules were checked.
    accounts = {d["metadata"]["name"]: d["spec"]["template"]["spec"] for d in find(manifests, "Deployment")}
    assert accounts["ipamgc-watcher"]["serviceAccountName"] == "ipamgc-watcher"
    assert accounts["ipamgc-leader"]["serviceAccountName"] == "ipamgc-leader"
    assert accounts["ipamgc-worker"]["serviceAccountName"] == "ipamgc-worker"
    assert accounts["ipamgc-worker"]["automountServiceAccountToken"] is False


@pytest.mark.parametrize(
    ("call", "allowed"),
    [
        (Call("get", "coordination.k8s.io", "leases", NAMESPACE, "ipamgc-leader"), True),
        (Call("get", "coordination.k8s.io", "leases", NAMESPACE, "ipamgc-watcher"), False),
        (Call("create", "coordination.k8s.io", "leases", NAMESPACE, None), True),
        (Call("get", "coordination.k8s.io", "leases", "kube-system", "ipamgc-leader"), False),
        (Call("delete", "crd.projectcalico.org", "ipamblocks", None, "10-0-0-0-26"), True),
        (Call("create", "crd.projectcalico.org", "ipamblocks", None, None), False),
        (Call("list", "", "pods", None, None), False),
    ],
)
def test_the_checker_reads_rules_as_rbac_does(manifests: list[Obj], call: Call, allowed: bool) -> None:
    assert any(g.allows(call) for g in grants(manifests, "ipamgc-leader")) is allowed
