"""The rule catalogue, a handle's all-or-none release (§3.9 step 3, §8.1 #5044, §8.15): no IP of a handle is
released while another of its IPs is valid, on any node."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from shared.rules import evaluate_node, handle_release
from shared.verdicts import KubeVirtView, LeakState, Reason, Release, Verdict
from tests.shared.catalogue_helpers import (
    LGP,
    N1,
    N2,
    T0,
    V6,
    VMS,
    _by_ip,
    _lookup,
    _pods,
    pod,
    pod_ip,
    tunnel_ip,
    vm_ip,
)

# ----------------------------------------------------------------------------------------------------
# Handle all-or-none (§3.9 step 3, §8.1 #5044, §8.15)


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        pytest.param([LeakState.CONFIRMED], Release.NOW, id="one-confirmed"),
        pytest.param([LeakState.CONFIRMED, LeakState.CONFIRMED], Release.NOW, id="all-confirmed"),
        pytest.param(
            [LeakState.CONFIRMED, LeakState.CANDIDATE], Release.AFTER_GRACE, id="one-still-candidate"
        ),
        pytest.param([LeakState.CANDIDATE, LeakState.CANDIDATE], Release.AFTER_GRACE, id="all-candidates"),
        pytest.param([LeakState.CONFIRMED, LeakState.VALID], Release.NEVER, id="one-valid"),
        pytest.param([LeakState.CANDIDATE, LeakState.VALID], Release.NEVER, id="candidate-and-valid"),
        pytest.param([LeakState.CONFIRMED, LeakState.IGNORED], Release.NEVER, id="one-ignored"),
        pytest.param([LeakState.VALID], Release.NEVER, id="valid"),
        pytest.param([LeakState.IGNORED], Release.NEVER, id="ignored"),
        pytest.param([], Release.NEVER, id="no-allocations"),
    ],
)
def test_handle_release(states: list[LeakState], expected: Release) -> None:
    assert handle_release(states) is expected
    assert handle_release(iter(states)) is expected


def _handle_states(verdicts: Sequence[Verdict], handle: str) -> list[LeakState]:
    return [v.state for v in verdicts if v.allocation.handle == handle]


@pytest.mark.parametrize("node_exists", [True, False], ids=["node-live", "node-gone"])
def test_dual_stack_with_single_stack_status_releases_nothing(node_exists: bool) -> None:
    """§8.1 (#5044): the IPv6 of a dual-stack pod whose status lists IPv4 only must not free the IPv4."""
    h = "k8s-pod-network.dual"
    v4, v6 = pod_ip(ip="10.244.1.5", handle=h), pod_ip(ip=V6, handle=h)
    timers = {v4.id: 0.0, v6.id: 0.0}
    nv = evaluate_node(N1, node_exists, [v4, v6], _lookup(_pods(pod(ips=("10.244.1.5",)))), timers, LGP, T0)
    got = _by_ip(nv)
    assert got[v4.ip].state is LeakState.VALID
    assert got[v6.ip].reason is Reason.POD_IP_MISMATCH
    assert got[v6.ip].state is LeakState.CONFIRMED  # the IP alone is a leak…
    assert handle_release(_handle_states(nv.verdicts, h)) is Release.NEVER  # …but its handle holds it


def test_leaked_ip_released_after_grace_unless_another_ip_of_its_handle_is_valid() -> None:
    """§10: released after the grace period; not released if another IP on the same handle is valid."""
    h = "k8s-pod-network.shared"
    a, b = pod_ip(ip="10.244.1.5", handle=h), pod_ip(ip="10.244.1.6", pod="web-1", handle=h)
    timers = {a.id: T0, b.id: T0}
    nv = evaluate_node(N1, True, [a, b], _lookup({}), timers, LGP, T0 + LGP + 1)
    assert handle_release(_handle_states(nv.verdicts, h)) is Release.NOW
    nv = evaluate_node(
        N1, True, [a, b], _lookup(_pods(pod(name="web-1", ips=(b.ip,)))), timers, LGP, T0 + LGP + 1
    )
    assert _by_ip(nv)[a.ip].state is LeakState.CONFIRMED
    assert handle_release(_handle_states(nv.verdicts, h)) is Release.NEVER
    nv = evaluate_node(N1, True, [a, b], _lookup({}), timers, None, T0 + LGP + 1)
    assert handle_release(_handle_states(nv.verdicts, h)) is Release.NEVER  # no grace period: node alive


def test_vm_handle_all_or_none_spans_nodes() -> None:
    """§8.15: one VM handle on two nodes (live migration): released only when every IP of it is a leak."""
    on_gone = vm_ip(ip="10.244.1.9", node=N1, pod="virt-launcher-a")
    on_live = vm_ip(ip="10.244.2.9", node=N2, pod="virt-launcher-b")
    assert on_gone.handle == on_live.handle
    no_vm = KubeVirtView(frozenset(), {})
    gone = evaluate_node(N1, False, [on_gone], _lookup({}), {}, LGP, T0, no_vm)
    live = evaluate_node(N2, True, [on_live], _lookup({}), {on_live.id: T0}, LGP, T0 + 60, no_vm)
    assert handle_release([*_handle_states(gone.verdicts, on_gone.handle), live.verdicts[0].state]) is (
        Release.AFTER_GRACE
    )
    live = evaluate_node(N2, True, [on_live], _lookup({}), {on_live.id: T0}, LGP, T0 + LGP + 1, no_vm)
    assert handle_release([gone.verdicts[0].state, live.verdicts[0].state]) is Release.NOW
    # The VM comes back: both IPs are valid again, on either node.
    gone = evaluate_node(N1, False, [on_gone], _lookup({}), {}, LGP, T0, VMS)
    live = evaluate_node(N2, True, [on_live], _lookup({}), {on_live.id: T0}, LGP, T0 + LGP + 1, VMS)
    assert [gone.verdicts[0].state, live.verdicts[0].state] == [LeakState.VALID, LeakState.VALID]
    assert gone.releasable is False


def test_node_deletion_waits_for_pods_then_cleans_in_one_pass() -> None:
    """§10: allocations untouched while their pods exist; once gone, IPs and affinities go in one pass."""
    a, b, t = pod_ip(ip="10.244.1.5"), pod_ip(ip="10.244.1.6", pod="web-1"), tunnel_ip()
    pods = _pods(pod(), pod(name="web-1", ips=(b.ip,)))
    nv = evaluate_node(N1, False, [t, a, b], _lookup(pods), {}, LGP, T0)
    assert [v.state for v in nv.verdicts if v.allocation.ip != t.ip] == [LeakState.VALID, LeakState.VALID]
    assert _by_ip(nv)[t.ip].state is LeakState.IGNORED
    assert not nv.releasable
    nv = evaluate_node(N1, False, [t, a, b], _lookup({}), {}, LGP, T0)
    assert {v.state for v in nv.verdicts} == {LeakState.CONFIRMED}
    assert all(handle_release([v.state]) is Release.NOW for v in nv.verdicts)
    assert nv.releasable
