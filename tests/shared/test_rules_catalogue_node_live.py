"""The rule catalogue, one node's pass (§3.6, §4, §10) on a node that exists: candidates, their timers and
leakGracePeriod, VM allocations' grace; judge's grace rules."""

from __future__ import annotations

import pytest

from shared.allocrules import allocation_validity, judge
from shared.rules import evaluate_node
from shared.verdicts import AllocationType, LeakState, Lookup, Reason
from tests.shared.catalogue_helpers import (
    A_POD,
    LGP,
    N1,
    N2,
    P_RUN,
    T0,
    VMS,
    NodeCase,
    _alloc,
    _lookup,
    _pods,
    check_node_case,
    pod,
    pod_ip,
    vm_ip,
)

# ----------------------------------------------------------------------------------------------------
# One node's pass (§3.6) — the rows of §4's summary table and §10's catalogue


NODE_CASES = [
    # §4: node exists + pod not found / on a different node / IPs don't include / terminal → candidate
    pytest.param(
        NodeCase(True, (A_POD,), expect={A_POD.ip: (LeakState.CANDIDATE, Reason.POD_MISSING)}),
        id="node-live-pod-missing-candidate",
    ),
    pytest.param(
        NodeCase(
            True,
            (A_POD,),
            pods=_pods(pod(node=N2, ips=("10.244.2.7",))),
            expect={A_POD.ip: (LeakState.CANDIDATE, Reason.POD_ON_OTHER_NODE)},
        ),
        id="node-live-pod-on-other-node-candidate",
    ),
    pytest.param(
        NodeCase(
            True,
            (A_POD,),
            pods=_pods(pod(node=N2, ips=(A_POD.ip,))),
            expect={A_POD.ip: (LeakState.VALID, Reason.STALE_NODE_ATTRIBUTE)},
        ),
        id="node-live-12257-stale-node-attribute-valid",
    ),
    pytest.param(
        NodeCase(
            True,
            (A_POD,),
            pods=_pods(pod(ips=("10.244.1.6",))),
            expect={A_POD.ip: (LeakState.CANDIDATE, Reason.POD_IP_MISMATCH)},
        ),
        id="node-live-ip-mismatch-candidate",
    ),
    *(
        pytest.param(
            NodeCase(
                True,
                (A_POD,),
                pods=_pods(pod(phase=ph)),
                expect={A_POD.ip: (LeakState.CANDIDATE, Reason.POD_TERMINATED)},
            ),
            id=f"node-live-terminal-{ph.lower()}-candidate",
        )
        for ph in ("Succeeded", "Failed", "Completed")
    ),
    pytest.param(
        NodeCase(
            True,
            (A_POD,),
            pods=_pods(pod(phase="Failed", reason="Evicted")),
            expect={A_POD.ip: (LeakState.CANDIDATE, Reason.POD_EVICTED)},
        ),
        id="node-live-evicted-candidate",
    ),
    pytest.param(
        NodeCase(
            True,
            (A_POD,),
            pods=_pods(pod(ips=())),
            timers={A_POD.ip: T0 - 10 * LGP},
            now=T0,
            expect={A_POD.ip: (LeakState.VALID, Reason.NO_POD_IP_YET)},
        ),
        id="node-live-no-ip-yet-valid",
    ),
    pytest.param(
        NodeCase(
            True,
            (_alloc("10.244.1.5", "h", {"node": N1}),),
            timers={"10.244.1.5": 0.0},
            now=T0,
            expect={"10.244.1.5": (LeakState.VALID, Reason.UNKNOWN_SOURCE)},
        ),
        id="node-live-non-pod-allocation-never-cleaned",
    ),
    pytest.param(
        NodeCase(True, (A_POD,), pods=_pods(P_RUN), expect={A_POD.ip: (LeakState.VALID, Reason.POD_RUNNING)}),
        id="fv-ip-matching-status-kept",
    ),
    # candidate → confirmed strictly after LGP
    pytest.param(
        NodeCase(
            True,
            (A_POD,),
            timers={A_POD.ip: T0},
            now=T0 + LGP,
            expect={A_POD.ip: (LeakState.CANDIDATE, Reason.POD_MISSING)},
        ),
        id="node-live-exactly-lgp-not-confirmed",
    ),
    pytest.param(
        NodeCase(
            True,
            (A_POD,),
            timers={A_POD.ip: T0},
            now=T0 + LGP + 0.5,
            expect={A_POD.ip: (LeakState.CONFIRMED, Reason.POD_MISSING)},
        ),
        id="node-live-after-lgp-confirmed",
    ),
    pytest.param(
        NodeCase(
            True,
            (A_POD,),
            timers={A_POD.ip: T0},
            now=T0 + 1.5,
            grace=1.0,
            expect={A_POD.ip: (LeakState.CONFIRMED, Reason.POD_MISSING)},
        ),
        id="fv-lgp-1s-ip-with-no-pod-cleaned",
    ),
    # LGP unset / 0
    pytest.param(
        NodeCase(
            True,
            (A_POD,),
            grace=None,
            timers={A_POD.ip: 0.0},
            now=T0,
            expect={A_POD.ip: (LeakState.IGNORED, Reason.POD_MISSING)},
        ),
        id="lgp-unset-live-node-never-candidate",
    ),
    pytest.param(
        NodeCase(
            True,
            (A_POD,),
            grace=0.0,
            timers={A_POD.ip: 0.0},
            now=T0 * 1000,
            expect={A_POD.ip: (LeakState.CANDIDATE, Reason.POD_MISSING)},
        ),
        id="lgp-0-candidate-never-confirmed",
    ),
    # VM allocations on live nodes: grace max(5m, LGP)
    *(
        pytest.param(
            NodeCase(
                True,
                (vm_ip(vm="vm-9"),),
                kubevirt=VMS,
                grace=g,
                timers={"10.244.1.9": T0},
                now=T0 + dt,
                expect={"10.244.1.9": (state, Reason.VM_MISSING)},
            ),
            id=f"vm-grace-{g}-after-{dt}s-{state.value}",
        )
        for g, dt, state in (
            (60.0, 299.0, LeakState.CANDIDATE),
            (60.0, 300.0, LeakState.CANDIDATE),
            (60.0, 300.5, LeakState.CONFIRMED),
            (None, 299.0, LeakState.CANDIDATE),
            (None, 301.0, LeakState.CONFIRMED),
            (0.0, 299.0, LeakState.CANDIDATE),
            (0.0, 301.0, LeakState.CONFIRMED),
            (LGP, 600.0, LeakState.CANDIDATE),
            (LGP, LGP, LeakState.CANDIDATE),
            (LGP, LGP + 1, LeakState.CONFIRMED),
        )
    ),
    pytest.param(
        NodeCase(
            True,
            (vm_ip(),),
            kubevirt=VMS,
            timers={"10.244.1.9": T0},
            now=T0 + 200,
            expect={"10.244.1.9": (LeakState.VALID, Reason.VM_EXISTS)},
        ),
        id="vm-reappears-within-grace-stops-gc",
    ),
    pytest.param(
        NodeCase(
            True,
            (vm_ip(),),
            kubevirt=None,
            expect={"10.244.1.9": (LeakState.VALID, Reason.KUBEVIRT_ABSENT)},
        ),
        id="vm-kubevirt-absent-valid",
    ),
]


@pytest.mark.parametrize("case", NODE_CASES)
def test_evaluate_node(case: NodeCase) -> None:
    check_node_case(case)


def test_node_gone_confirms_at_first_sight_and_keeps_the_timer_start() -> None:
    a = pod_ip()
    nv = evaluate_node(N1, False, [a], _lookup({}), {}, None, T0)
    assert (nv.verdicts[0].state, nv.verdicts[0].first_seen) == (LeakState.CONFIRMED, T0)
    nv = evaluate_node(N1, False, [a], _lookup({}), {a.id: T0 - 5}, None, T0)
    assert nv.verdicts[0].first_seen == T0 - 5


def test_candidate_timer_starts_at_first_observation_then_confirms() -> None:
    """§4.2: pod deleted without CNI DEL on a live node: candidate now, confirmed at the first check > LGP."""
    a = pod_ip()
    first = evaluate_node(N1, True, [a], _lookup({}), {}, LGP, T0).verdicts[0]
    assert (first.state, first.first_seen) == (LeakState.CANDIDATE, T0)
    timers = {a.id: first.first_seen}
    for now, state in ((T0 + LGP / 2, LeakState.CANDIDATE), (T0 + LGP, LeakState.CANDIDATE)):
        v = evaluate_node(N1, True, [a], _lookup({}), timers, LGP, now).verdicts[0]
        assert (v.state, v.first_seen) == (state, T0)
    v = evaluate_node(N1, True, [a], _lookup({}), timers, LGP, T0 + LGP + 1).verdicts[0]
    assert (v.state, v.first_seen) == (LeakState.CONFIRMED, T0)


def test_valid_observation_resets_the_candidate() -> None:
    """§8.3: a pod recreated between syncs — any later valid observation clears the timer (markValid)."""
    a = pod_ip()
    v = evaluate_node(N1, True, [a], _lookup(_pods(pod())), {a.id: T0}, LGP, T0 + 2 * LGP).verdicts[0]
    assert (v.state, v.first_seen) == (LeakState.VALID, None)


def test_statefulset_name_reuse() -> None:
    """§8.14: a new pod with the old name and no IP keeps the old allocation; once it reports its IP, not."""
    old = pod_ip(ip="10.244.1.5", pod="db-0", handle="k8s-pod-network.old")
    new_without_ip = pod(name="db-0", ips=())
    v = evaluate_node(N1, True, [old], _lookup(_pods(new_without_ip)), {}, LGP, T0).verdicts[0]
    assert (v.state, v.reason) == (LeakState.VALID, Reason.NO_POD_IP_YET)
    new_with_ip = pod(name="db-0", ips=("10.244.1.6",))
    v = evaluate_node(N1, True, [old], _lookup(_pods(new_with_ip)), {}, LGP, T0).verdicts[0]
    assert (v.state, v.reason) == (LeakState.CANDIDATE, Reason.POD_IP_MISMATCH)


def test_judge_grace_rules() -> None:
    a = pod_ip()
    bad = allocation_validity(a, N1, Lookup.MISSING)
    assert judge(a, AllocationType.POD, bad, False, None, None, T0).state is LeakState.CONFIRMED
    assert judge(a, AllocationType.POD, bad, True, None, None, T0).state is LeakState.IGNORED
    assert judge(a, AllocationType.POD, bad, True, 0.0, T0 - 10**6, T0).state is LeakState.CANDIDATE
    assert judge(a, AllocationType.POD, bad, True, LGP, T0 - LGP, T0).state is LeakState.CANDIDATE
    assert judge(a, AllocationType.POD, bad, True, LGP, T0 - LGP - 1, T0).state is LeakState.CONFIRMED
    assert judge(a, AllocationType.VM, bad, True, 0.0, T0 - 301, T0).state is LeakState.CONFIRMED
    assert judge(a, AllocationType.VM, bad, True, None, T0 - 300, T0).state is LeakState.CANDIDATE
    good = allocation_validity(a, N1, pod())
    v = judge(a, AllocationType.POD, good, True, LGP, T0 - 10 * LGP, T0)
    assert (v.state, v.first_seen) == (LeakState.VALID, None)
