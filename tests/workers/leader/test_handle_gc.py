"""The handle collector, class by class (docs/handles.md): each repair waits for the grace period and three
scans, writes only the IPAMHandle, conditionally, on both of Calico's API groups; a dry run writes
nothing; `handle_gc=False` does not even list."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from ipamgc import runner
from ipamgc.commands import lead as lead_command
from kubeio.errors import ApiRefused
from shared.names import handle_name
from tests.fixtures.leader import GRACE, Env
from tests.workers.leader.handle_gc_helpers import (
    SCAN,
    drop_handle,
    gc_leader,
    gc_leader_on,
    handle_obj,
    handle_records,
    leader_writes,
    orphan,
    passes,
    repaired,
    set_counts,
)
from workers.leader.audit import Result
from workers.leader.settings import LeaderSettings

NODE = "node-a"


def _pod(env: Env, pod: str = "web-0") -> tuple[str, str, str]:
    """A running pod: (its handle, its IP, its block)."""
    if not env.sim.store.list("nodes")["items"]:
        env.sim.add_node(NODE)
    [ip] = env.sim.create_pod("ns", pod, NODE)
    handle, _ = env.sim.pod_handles[("ns", pod)]
    [cidr] = handle_obj(env, handle)["spec"]["block"]
    return handle, ip, cidr


@pytest.mark.parametrize("group", ["v1", "v3"])
def test_a_missing_handle_is_recreated_with_what_its_blocks_hold(env: Env, env_v3: Env, group: str) -> None:
    e = env if group == "v1" else env_v3
    handle, ip, cidr = _pod(e)
    drop_handle(e, handle)  # a crash after the block write, its handle lost (#3940)
    lead = gc_leader(e)
    passes(e, lead, 2)
    assert leader_writes(e) == []  # two scans: not yet, whatever the time
    passes(e, lead, 1)
    assert repaired(e) == [(handle, "missing", "create")]
    assert leader_writes(e) == [("POST", "ipamhandles", 201)]
    obj = handle_obj(e, handle)
    assert obj["apiVersion"] == e.sim.calico.api_version
    assert obj["spec"] == {"handleID": handle, "block": {cidr: 1}, "deleted": False}
    assert e.sim.cni.ips_by_handle(handle) == [ip]  # ReleaseByHandle and IPsByHandle work again
    assert e.consistent() == []
    assert e.sim.truth.violations == []


@pytest.mark.parametrize("group", ["v1", "v3"])
def test_a_skewed_handle_gets_the_counts_its_blocks_hold(env: Env, env_v3: Env, group: str) -> None:
    e = env if group == "v1" else env_v3
    handle, _, cidr = _pod(e)
    set_counts(e, handle, {cidr: 3, "10.244.200.0/26": 1})  # a release's decrement lost, and worse
    lead = gc_leader(e)
    passes(e, lead, 3)
    assert repaired(e) == [(handle, "skewed", "set-counts")]
    assert leader_writes(e) == [("PUT", "ipamhandles", 200)]
    assert handle_obj(e, handle)["spec"]["block"] == {cidr: 1}
    [rec] = handle_records(e)
    gc = rec.evidence["handle_gc"]
    assert gc["observed"]["recorded"] == {cidr: 3, "10.244.200.0/26": 1}
    assert gc["observed"]["held"] == {cidr: 1} and gc["passes"] == 3 and gc["held_for"] >= GRACE
    assert gc["live"]["blocks"]["10.244.200.0/26"] == "absent"
    assert e.consistent() == []


def test_an_orphan_is_emptied_then_deleted_each_after_its_own_window(env: Env) -> None:
    _, _, cidr = _pod(env)
    orphan(env, "k8s-pod-network.dead", {cidr: 1})  # a CNI that died between its handle and block writes
    lead = gc_leader(env)
    passes(env, lead, 3)
    assert repaired(env) == [("k8s-pod-network.dead", "orphan", "empty")]
    assert handle_obj(env, "k8s-pod-network.dead")["spec"]["block"] == {}
    passes(env, lead, 2)
    assert len(repaired(env)) == 1  # the emptied handle is a new observation: three scans again
    passes(env, lead, 2)
    assert [a for _, _, a in repaired(env)] == ["empty", "delete"]
    assert [w[:2] for w in leader_writes(env)] == [("PUT", "ipamhandles"), ("DELETE", "ipamhandles")]
    assert handle_name("k8s-pod-network.dead") not in {
        o["metadata"]["name"] for o in env.server.store.list("ipamhandles")["items"]
    }
    delete = [r for r in env.server.requests if r.method == "DELETE" and r.resource == "ipamhandles"]
    assert delete and delete[0].status == 200
    assert env.consistent() == []


def test_a_stuck_soft_delete_is_finished_and_a_held_handle_recreated_after(env: Env) -> None:
    handle, ip, cidr = _pod(env)
    set_counts(env, handle, {}, deleted=True)  # the deleter died between its two writes
    orphan(env, "k8s-pod-network.gone", {}, deleted=True)
    lead = gc_leader(env)
    passes(env, lead, 3)
    assert sorted(repaired(env)) == sorted(
        [(handle, "stuck-deleted", "delete"), ("k8s-pod-network.gone", "stuck-deleted", "delete")]
    )
    passes(env, lead, 3)  # the pod's handle is now missing: three more scans, then created again
    assert repaired(env)[-1] == (handle, "missing", "create")
    assert handle_obj(env, handle)["spec"] == {"handleID": handle, "block": {cidr: 1}, "deleted": False}
    assert env.sim.cni.ips_by_handle(handle) == [ip]
    assert env.consistent() == []


def test_nothing_is_repaired_before_the_grace_period_however_many_scans(env: Env) -> None:
    handle, _, cidr = _pod(env)
    set_counts(env, handle, {cidr: 2})
    lead = gc_leader(env)
    passes(env, lead, int(GRACE // SCAN), every=SCAN)  # 15 scans within the grace period
    assert leader_writes(env) == []
    passes(env, lead, 2, every=SCAN)
    assert repaired(env) == [(handle, "skewed", "set-counts")]


def test_a_change_of_evidence_starts_the_count_again(env: Env) -> None:
    handle, _, cidr = _pod(env)
    set_counts(env, handle, {cidr: 2})
    lead = gc_leader(env)
    passes(env, lead, 2)
    set_counts(env, handle, {cidr: 3})  # written meanwhile: a new resourceVersion, new counts
    passes(env, lead, 2)
    assert leader_writes(env) == []
    passes(env, lead, 1)
    assert repaired(env) == [(handle, "skewed", "set-counts")]
    assert handle_records(env)[0].evidence["handle_gc"]["observed"]["recorded"] == {cidr: 3}


def test_a_dry_run_reports_once_and_writes_nothing(env: Env) -> None:
    handle, _, cidr = _pod(env)
    set_counts(env, handle, {cidr: 2})
    drop_handle(env, _pod(env, "web-1")[0])
    lead = gc_leader(env, dry_run=True)
    passes(env, lead, 6)
    assert leader_writes(env) == []
    recs = handle_records(env)
    assert sorted((r.result, r.rule, r.reason) for r in recs) == [
        (Result.DRY_RUN, "handle-missing", "would create"),
        (Result.DRY_RUN, "handle-skewed", "would set-counts"),
    ]
    status = env.redis.hgetall(env.keys.handle_gc)
    assert status[b"dry_run"] == b"1" and status[b"divergent|skewed"] == b"1"


def test_switched_off_it_does_not_even_list(env: Env) -> None:
    handle, _, cidr = _pod(env)
    set_counts(env, handle, {cidr: 2})
    env.sync()
    lead = env.leader(handle_gc=False)
    passes(env, lead, 6)
    assert [r for r in env.server.requests if r.resource == "ipamhandles" and r.verb == "list"] == []
    assert handle_obj(env, handle)["spec"]["block"] == {cidr: 2}
    assert env.redis.exists(env.keys.handle_gc) == 0


def test_metrics_and_status_count_per_class(env: Env) -> None:
    handle, _, cidr = _pod(env)
    set_counts(env, handle, {cidr: 2})
    orphan(env, "k8s-pod-network.dead", {})
    lead = gc_leader(env)
    passes(env, lead, 1)
    m = lead.metrics.handle_gc
    assert m.divergent.labels("skewed")._value.get() == 1
    assert m.divergent.labels("orphan")._value.get() == 1
    assert m.found.labels("orphan")._value.get() == 1
    passes(env, lead, 2)
    assert m.repaired.labels("skewed", "set-counts")._value.get() == 1
    assert m.repaired.labels("orphan", "delete")._value.get() == 1
    status = {k.decode(): v.decode() for k, v in env.redis.hgetall(env.keys.handle_gc).items()}
    assert status["repaired|skewed"] == "1" and status["repaired|orphan"] == "1"
    assert status["refused|skewed"] == "0"


@pytest.mark.parametrize(
    ("args", "env", "on"),
    [([], {}, True), (["--no-handle-gc"], {}, False), ([], {"IPAMGC_NO_HANDLE_GC": "1"}, False)],
)
def test_the_off_switch_reaches_the_leader(
    monkeypatch: pytest.MonkeyPatch, args: list[str], env: dict[str, str], on: bool
) -> None:
    seen: list[LeaderSettings] = []

    def run(settings: LeaderSettings, stop: object, **_: object) -> int:
        seen.append(settings)
        return 0

    monkeypatch.setattr(lead_command, "run_leader", run)
    monkeypatch.setattr(runner, "Heartbeat", _NoHeartbeat)
    result = CliRunner().invoke(lead_command.lead, ["--metrics-port", "0", *args], env=env)
    assert result.exit_code == 0, result.output
    [settings] = seen
    assert settings.handle_gc is on


class _NoHeartbeat:
    def __init__(self, *_: object) -> None:
        pass

    def start(self) -> _NoHeartbeat:
        return self

    def stop(self) -> None:
        pass


class _Refusing:
    """The leader's API on a role without `list` of IPAMHandles (an upgrade before its RBAC)."""

    def __init__(self, api: Any) -> None:
        self.api = api
        self.refuse = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self.api, name)

    def list_page(self, plural: str, limit: int, cont: str = "") -> tuple[list[Any], str]:
        if self.refuse:
            raise ApiRefused("list ipamhandles: forbidden", status=403)
        out: tuple[list[Any], str] = self.api.list_page(plural, limit, cont)
        return out


def test_a_refused_scan_never_stops_the_leader_and_judges_nothing(env: Env) -> None:
    handle, _, cidr = _pod(env)
    set_counts(env, handle, {cidr: 2})
    api = _Refusing(env.api("leader-a"))
    lead = gc_leader_on(env, api)
    passes(env, lead, 3)  # refused three times: logged, nothing judged, the leader still leading
    assert lead.handles.history == {} and leader_writes(env) == []
    api.refuse = False
    passes(env, lead, 3)
    assert repaired(env) == [(handle, "skewed", "set-counts")]


def test_a_scan_costing_more_than_its_share_of_a_core_makes_the_next_one_wait(env: Env) -> None:
    _pod(env)
    # Nothing divergent: the quiet share applies; any scan is too costly for this one.
    lead = gc_leader(env, handle_gc_quiet_cpu_share=1e-9)
    passes(env, lead, 4, every=SCAN)
    assert lead.handles.scans == 1 and lead.handles.last_scan_cpu > 0
    assert lead.handles.scan_interval() == lead.handles.last_scan_cpu / 1e-9
    # While divergent handles wait for their consecutive scans, the (larger) share of repairs applies.
    lead.handles.history = {"h": object()}  # type: ignore[dict-item]  # only its emptiness is read
    assert lead.handles.scan_interval() == max(SCAN, lead.handles.last_scan_cpu / 0.005)
    normal = gc_leader(env, "leader-b")
    passes(env, normal, 4, every=SCAN)
    assert normal.handles.scans == 4
