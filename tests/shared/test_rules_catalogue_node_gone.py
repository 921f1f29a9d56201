"""The rule catalogue, one node's pass (§3.6, §4's summary table, §10) on a node that is gone: leaks confirmed
at first sight, its tunnel IP only once nothing valid remains (never on a live node), when releasable."""

from __future__ import annotations

import pytest

from shared.verdicts import LeakState, Lookup, Reason
from tests.shared.catalogue_helpers import (
    A_POD,
    A_TUN,
    LGP,
    N1,
    NS,
    TUNNEL_TYPES,
    VMS,
    NodeCase,
    _alloc,
    _pods,
    check_node_case,
    pod,
    reserved_ip,
    tunnel_ip,
    unknown_ip,
    vm_ip,
)

# ----------------------------------------------------------------------------------------------------
# One node's pass (§3.6) — the rows of §4's summary table and §10's catalogue


NODE_CASES = [
    # §4: node gone + pod missing / mismatched → confirmed at first check, whatever the grace period
    *(
        pytest.param(
            NodeCase(False, (A_POD,), grace=g, expect={A_POD.ip: (LeakState.CONFIRMED, Reason.POD_MISSING)}),
            id=f"node-gone-pod-missing-confirmed-grace-{g}",
        )
        for g in (None, 0.0, LGP)
    ),
    pytest.param(
        NodeCase(
            False,
            (A_POD,),
            pods=_pods(pod(ips=("10.244.1.6",))),
            grace=0.0,
            expect={A_POD.ip: (LeakState.CONFIRMED, Reason.POD_IP_MISMATCH)},
        ),
        id="node-gone-pod-mismatch-confirmed",
    ),
    pytest.param(
        NodeCase(
            False,
            (A_POD,),
            pods=_pods(pod(phase="Succeeded")),
            grace=None,
            expect={A_POD.ip: (LeakState.CONFIRMED, Reason.POD_TERMINATED)},
        ),
        id="node-gone-terminal-pod-confirmed",
    ),
    pytest.param(
        NodeCase(
            False,
            (vm_ip(vm="vm-9"),),
            grace=LGP,
            expect={"10.244.1.9": (LeakState.CONFIRMED, Reason.VM_MISSING)},
            kubevirt=VMS,
        ),
        id="node-gone-vm-missing-confirmed-without-vm-grace",
    ),
    # §4: node gone + tunnel IP → confirmed only when nothing valid/unknown remains
    *(
        pytest.param(
            NodeCase(
                False,
                (tunnel_ip(kind=k),),
                grace=None,
                expect={tunnel_ip(kind=k).ip: (LeakState.CONFIRMED, Reason.NODE_MISSING)},
                releasable=True,
            ),
            id=f"node-gone-only-{k}-confirmed",
        )
        for k in TUNNEL_TYPES
    ),
    *(
        pytest.param(
            NodeCase(
                True,
                (tunnel_ip(kind=k),),
                expect={tunnel_ip(kind=k).ip: (LeakState.VALID, Reason.TUNNEL_NODE_EXISTS)},
                releasable=False,
            ),
            id=f"node-live-{k}-never",
        )
        for k in TUNNEL_TYPES
    ),
    pytest.param(
        NodeCase(
            False,
            (A_TUN, A_POD),
            grace=0.0,
            expect={
                A_TUN.ip: (LeakState.CONFIRMED, Reason.NODE_MISSING),
                A_POD.ip: (LeakState.CONFIRMED, Reason.POD_MISSING),
            },
            releasable=True,
        ),
        id="node-gone-tunnel-and-leaked-pod-single-pass",
    ),
    pytest.param(
        NodeCase(
            False,
            (A_TUN, A_POD),
            pods=_pods(pod(node=N1)),
            expect={
                A_TUN.ip: (LeakState.IGNORED, Reason.NODE_IN_USE),
                A_POD.ip: (LeakState.VALID, Reason.POD_RUNNING),
            },
            releasable=False,
        ),
        id="node-gone-pod-still-exists-keeps-tunnel",
    ),
    pytest.param(
        NodeCase(
            False,
            (A_POD, A_TUN),
            pods=_pods(pod(node=N1)),
            expect={A_TUN.ip: (LeakState.IGNORED, Reason.NODE_IN_USE)},
            releasable=False,
        ),
        id="node-gone-valid-pod-listed-before-tunnel",
    ),
    pytest.param(
        NodeCase(
            False,
            (A_TUN, A_POD),
            pods=_pods(pod(ips=())),
            expect={
                A_TUN.ip: (LeakState.IGNORED, Reason.NODE_IN_USE),
                A_POD.ip: (LeakState.VALID, Reason.NO_POD_IP_YET),
            },
            releasable=False,
        ),
        id="node-gone-pod-without-ip-keeps-tunnel",
    ),
    pytest.param(
        NodeCase(
            False,
            (A_TUN, A_POD),
            pods={(NS, "web-0"): Lookup.UNKNOWN},
            expect={A_TUN.ip: (LeakState.IGNORED, Reason.NODE_IN_USE)},
            releasable=False,
        ),
        id="node-gone-pod-lookup-error-keeps-tunnel",
    ),
    pytest.param(
        NodeCase(
            False,
            (A_TUN, unknown_ip()),
            expect={
                A_TUN.ip: (LeakState.IGNORED, Reason.NODE_IN_USE),
                "10.244.1.20": (LeakState.VALID, Reason.UNKNOWN_SOURCE),
            },
            releasable=False,
        ),
        id="node-gone-unknown-source-blocks-cleanup",
    ),
    pytest.param(
        NodeCase(
            False,
            (A_TUN, _alloc("10.244.1.21", "legacy", {"node": N1, "namespace": NS})),
            expect={A_TUN.ip: (LeakState.IGNORED, Reason.NODE_IN_USE)},
            releasable=False,
        ),
        id="node-gone-allocation-without-pod-attr-blocks-cleanup",
    ),
    pytest.param(
        NodeCase(
            False,
            (A_TUN, reserved_ip()),
            expect={
                A_TUN.ip: (LeakState.CONFIRMED, Reason.NODE_MISSING),
                "10.244.1.1": (LeakState.VALID, Reason.WINDOWS_RESERVED),
            },
            releasable=True,
        ),
        id="node-gone-windows-reserved-does-not-block",
    ),
    pytest.param(
        NodeCase(
            False,
            (A_TUN, vm_ip()),
            kubevirt=VMS,
            expect={
                A_TUN.ip: (LeakState.IGNORED, Reason.NODE_IN_USE),
                "10.244.1.9": (LeakState.VALID, Reason.VM_EXISTS),
            },
            releasable=False,
        ),
        id="node-gone-live-vm-keeps-tunnel",
    ),
    pytest.param(NodeCase(False, (), releasable=True), id="node-gone-no-allocations-releasable"),
    pytest.param(NodeCase(True, (), releasable=False), id="node-live-never-releasable"),
    pytest.param(
        NodeCase(
            True, (A_POD,), expect={A_POD.ip: (LeakState.CANDIDATE, Reason.POD_MISSING)}, releasable=False
        ),
        id="node-live-leak-not-releasable",
    ),
]


@pytest.mark.parametrize("case", NODE_CASES)
def test_evaluate_node(case: NodeCase) -> None:
    check_node_case(case)
