"""The rule catalogue (`calico-ipam-gc.md` §2.2, §3.6, §3.7): how an allocation is classified, the IPs a
pod reports as Calico derives them, and markLeak with its grace periods."""

from __future__ import annotations

import ipaddress

import pytest

from shared.allocrules import VM_RECREATION_GRACE_SECONDS, classify, leak_grace, mark_leak
from shared.model import Allocation, Pod
from shared.podips import UnparsablePodIP, pod_reported_ips
from shared.verdicts import AllocationType, LeakState
from tests.shared.catalogue_helpers import (
    LGP,
    N1,
    NS,
    T0,
    TUNNEL_TYPES,
    V6,
    _alloc,
    pod,
    pod_ip,
    reserved_ip,
    tunnel_ip,
    unknown_ip,
    vm_ip,
)

# ----------------------------------------------------------------------------------------------------
# classification (§2.2)


@pytest.mark.parametrize(
    ("alloc", "expected"),
    [
        *(pytest.param(tunnel_ip(kind=k), AllocationType.TUNNEL, id=f"tunnel-{k}") for k in TUNNEL_TYPES),
        pytest.param(pod_ip(), AllocationType.POD, id="pod-namespace-and-pod"),
        pytest.param(vm_ip(), AllocationType.VM, id="vm-vmi-name-present"),
        pytest.param(reserved_ip(), AllocationType.RESERVED, id="windows-reserved-handle"),
        pytest.param(
            _alloc("10.244.1.2", "Windows-Reserved-IPAM-Handle", {"node": N1}),
            AllocationType.UNKNOWN,
            id="windows-handle-is-case-sensitive",
        ),
        pytest.param(unknown_ip(), AllocationType.UNKNOWN, id="loadbalancer-with-node-is-unknown"),
        pytest.param(
            _alloc("10.244.1.3", "vxlan-tunnel-addr-node-1", {"node": N1}),
            AllocationType.UNKNOWN,
            id="handle-prefix-not-parsed",
        ),
        pytest.param(
            _alloc("10.244.1.3", "h", {"node": N1, "namespace": NS}), AllocationType.UNKNOWN, id="no-pod-attr"
        ),
        pytest.param(
            _alloc("10.244.1.3", "h", {"node": N1, "pod": "web-0"}), AllocationType.UNKNOWN, id="no-ns-attr"
        ),
        pytest.param(
            _alloc("10.244.1.3", "h", {"node": N1, "namespace": "", "pod": ""}),
            AllocationType.UNKNOWN,
            id="empty-owner-attrs",
        ),
        pytest.param(
            _alloc("10.244.1.3", "h", {"node": N1, "namespace": NS, "vmi-name": "vm-0"}),
            AllocationType.UNKNOWN,
            id="vmi-name-without-pod-is-not-a-pod-ip",
        ),
        pytest.param(
            _alloc("10.244.1.3", "h", {"node": N1, "namespace": NS, "pod": "p", "type": "ipipTunnelAddress"}),
            AllocationType.TUNNEL,
            id="tunnel-type-wins-over-pod-attrs",
        ),
        pytest.param(
            _alloc("10.244.1.3", "h", {"node": N1, "type": "LoadBalancer"}),
            AllocationType.UNKNOWN,
            id="other-type-is-unknown",
        ),
    ],
)
def test_classify(alloc: Allocation, expected: AllocationType) -> None:
    assert classify(alloc) is expected


# ----------------------------------------------------------------------------------------------------
# Calico's workload-endpoint IP derivation (§3.7 step 8)


@pytest.mark.parametrize(
    ("p", "expected"),
    [
        pytest.param(pod(ips=("10.244.1.5", V6)), ["10.244.1.5", V6], id="status-podIPs"),
        pytest.param(
            pod(ips=("10.244.1.5",), pod_ip="10.244.1.9"), ["10.244.1.5"], id="podIPs-preferred-over-podIP"
        ),
        pytest.param(pod(ips=(), pod_ip="10.244.1.9"), ["10.244.1.9"], id="status-podIP"),
        pytest.param(
            pod(
                ips=(),
                annotations={
                    "cni.projectcalico.org/podIPs": "10.244.1.5/32,fd00:10:244::5/128",
                    "cni.projectcalico.org/podIP": "10.244.1.8/32",
                    "vpc.amazonaws.com/pod-ips": "10.244.1.9",
                },
            ),
            ["10.244.1.5", V6],
            id="annotation-podIPs",
        ),
        pytest.param(
            pod(
                ips=(),
                annotations={
                    "cni.projectcalico.org/podIP": "10.244.1.8/32",
                    "vpc.amazonaws.com/pod-ips": "10.244.1.9",
                },
            ),
            ["10.244.1.8"],
            id="annotation-podIP",
        ),
        pytest.param(
            pod(ips=(), annotations={"vpc.amazonaws.com/pod-ips": "10.244.1.9,10.244.1.10"}),
            ["10.244.1.9", "10.244.1.10"],
            id="annotation-aws",
        ),
        pytest.param(
            pod(ips=("10.244.1.5",), annotations={"cni.projectcalico.org/podIPs": "10.244.1.8"}),
            ["10.244.1.5"],
            id="status-preferred-over-annotations",
        ),
        pytest.param(pod(ips=()), [], id="nothing"),
        pytest.param(pod(phase="Succeeded"), [], id="finished-has-no-ips"),
    ],
)
def test_pod_reported_ips(p: Pod, expected: list[str]) -> None:
    assert pod_reported_ips(p) == [ipaddress.ip_address(x) for x in expected]


def test_a_blanked_annotation_empties_the_ips_of_a_terminating_pod_only_when_read_live() -> None:
    p = pod(deleting=True, annotations={"cni.projectcalico.org/podIP": ""})
    assert pod_reported_ips(p) == [ipaddress.ip_address("10.244.1.5")]  # Calico's cache: no timestamp
    assert pod_reported_ips(p, live=True) == []


def test_a_finished_pods_ips_are_parsed_before_its_phase_is_looked_at() -> None:
    with pytest.raises(UnparsablePodIP):
        pod_reported_ips(pod(ips=("10.244.1.999",), phase="Succeeded"))


# ----------------------------------------------------------------------------------------------------
# markLeak and the grace periods (§3.6 steps 3.5–3.8)


@pytest.mark.parametrize(
    ("first_seen", "grace", "now", "state", "start"),
    [
        pytest.param(None, LGP, T0, LeakState.CANDIDATE, T0, id="first-observation-starts-timer"),
        pytest.param(T0, LGP, T0 + LGP - 1, LeakState.CANDIDATE, T0, id="within-grace"),
        pytest.param(T0, LGP, T0 + LGP, LeakState.CANDIDATE, T0, id="exactly-grace-is-not-enough"),
        pytest.param(T0, LGP, T0 + LGP + 0.001, LeakState.CONFIRMED, T0, id="strictly-after-grace"),
        pytest.param(T0, 0.0, T0 + 10**9, LeakState.CANDIDATE, T0, id="grace-0-never-confirms"),
        pytest.param(None, 0.0, T0, LeakState.CANDIDATE, T0, id="grace-0-first-observation"),
        pytest.param(T0, 1.0, T0 + 1.5, LeakState.CONFIRMED, T0, id="fv-lgp-1s"),
    ],
)
def test_mark_leak(
    first_seen: float | None, grace: float, now: float, state: LeakState, start: float
) -> None:
    assert mark_leak(first_seen, grace, now) == (state, start)


@pytest.mark.parametrize(
    ("grace", "is_vm", "expected"),
    [
        pytest.param(None, False, None, id="pod-unset"),
        pytest.param(0.0, False, 0.0, id="pod-zero"),
        pytest.param(LGP, False, LGP, id="pod-lgp"),
        pytest.param(None, True, VM_RECREATION_GRACE_SECONDS, id="vm-unset-5m"),
        pytest.param(0.0, True, VM_RECREATION_GRACE_SECONDS, id="vm-zero-5m"),
        pytest.param(60.0, True, VM_RECREATION_GRACE_SECONDS, id="vm-smaller-5m"),
        pytest.param(LGP, True, LGP, id="vm-larger-lgp"),
    ],
)
def test_leak_grace(grace: float | None, is_vm: bool, expected: float | None) -> None:
    assert VM_RECREATION_GRACE_SECONDS == 300.0
    assert leak_grace(grace, is_vm) == expected
