"""The rule catalogue, allocationIsValid (§3.7), steps 6–9: no IP reported yet, evicted and finished pods,
the parsed comparison of the pod's IPs; the live read of the final re-check; unparsable pod IPs."""

from __future__ import annotations

import pytest

from shared.allocrules import allocation_validity
from shared.model import Allocation, Pod
from shared.verdicts import KubeVirtView, Lookup, PodView, Reason
from tests.shared.catalogue_helpers import N1, V6, pod, pod_ip

# ----------------------------------------------------------------------------------------------------
# allocationIsValid, in Calico's evaluation order (§3.7, §3.8)


VALIDITY_CASES = [
    # 6. no IP reported yet (status.podIP == "" or status.podIPs empty)
    pytest.param(pod_ip(), N1, pod(ips=()), None, True, Reason.NO_POD_IP_YET, id="no-ip-yet"),
    pytest.param(
        pod_ip(),
        N1,
        pod(ips=(), pod_ip="10.244.1.77"),
        None,
        True,
        Reason.NO_POD_IP_YET,
        id="no-ip-yet-podIP-without-podIPs",
    ),
    pytest.param(
        pod_ip(),
        N1,
        pod(ips=("10.244.1.77",), pod_ip=""),
        None,
        True,
        Reason.NO_POD_IP_YET,
        id="no-ip-yet-podIPs-without-podIP",
    ),
    pytest.param(
        pod_ip(),
        N1,
        pod(ips=(), annotations={"cni.projectcalico.org/podIPs": "10.244.1.77/32"}),
        None,
        True,
        Reason.NO_POD_IP_YET,
        id="no-ip-yet-annotations-do-not-override-status",
    ),
    pytest.param(
        pod_ip(),
        N1,
        pod(ips=(), phase="Succeeded"),
        None,
        True,
        Reason.NO_POD_IP_YET,
        id="no-ip-yet-before-phase",
    ),
    # 7. evicted
    pytest.param(
        pod_ip(),
        N1,
        pod(phase="Failed", reason="Evicted"),
        None,
        False,
        Reason.POD_EVICTED,
        id="failed-evicted-reporting-the-ip",
    ),
    pytest.param(
        pod_ip(),
        N1,
        pod(ips=(), phase="Failed", reason="Evicted"),
        None,
        True,
        Reason.NO_POD_IP_YET,
        id="evicted-without-ip-is-no-ip-yet",
    ),
    pytest.param(
        pod_ip(),
        N1,
        pod(phase="Running", reason="Evicted"),
        None,
        True,
        Reason.POD_RUNNING,
        id="evicted-not-failed",
    ),
    # 8. finished pods: their IP list is empty
    *(
        pytest.param(
            pod_ip(), N1, pod(phase=phase), None, False, Reason.POD_TERMINATED, id=f"terminal-{phase.lower()}"
        )
        for phase in ("Succeeded", "Failed", "Completed")
    ),
    # Calico's cache has no deletion timestamp (`PodTransformer`): a blanked annotation finishes
    # nothing there, the pod's status still reports the IP (the live view: LIVE_VALIDITY_CASES).
    pytest.param(
        pod_ip(),
        N1,
        pod(deleting=True, annotations={"cni.projectcalico.org/podIP": ""}),
        None,
        True,
        Reason.POD_RUNNING,
        id="deleting-calico-annotation-blank-cache-view",
    ),
    pytest.param(
        pod_ip(),
        N1,
        pod(deleting=True, annotations={"vpc.amazonaws.com/pod-ips": ""}),
        None,
        True,
        Reason.POD_RUNNING,
        id="deleting-aws-annotation-blank-cache-view",
    ),
    # A finished pod's IPs are parsed before its phase is looked at (`getPodIPs`, then `IsFinished`).
    *(
        pytest.param(
            pod_ip(),
            N1,
            pod(ips=("10.244.1.999",), phase=phase),
            None,
            True,
            Reason.POD_IP_UNPARSABLE,
            id=f"terminal-{phase.lower()}-unparsable-ip",
        )
        for phase in ("Succeeded", "Failed", "Completed")
    ),
    # No `status.reason` in Calico's cache: an evicted pod is a failed one, decided after the parse.
    pytest.param(
        pod_ip(),
        N1,
        pod(ips=("10.244.1.999",), phase="Failed", reason="Evicted"),
        None,
        True,
        Reason.POD_IP_UNPARSABLE,
        id="evicted-unparsable-ip-cache-view",
    ),
    pytest.param(
        pod_ip(),
        N1,
        pod(ips=("10.244.1.6",), phase="Failed", reason="Evicted"),
        None,
        False,
        Reason.POD_EVICTED,
        id="evicted-other-ip-cache-view",
    ),
    pytest.param(
        pod_ip(),
        N1,
        pod(deleting=True, annotations={"cni.projectcalico.org/podIP": "10.244.1.5/32"}),
        None,
        True,
        Reason.POD_RUNNING,
        id="deleting-calico-annotation-set",
    ),
    pytest.param(
        pod_ip(),
        N1,
        pod(deleting=True),
        None,
        True,
        Reason.POD_RUNNING,
        id="deleting-without-annotation",
    ),
    pytest.param(
        pod_ip(),
        N1,
        pod(annotations={"cni.projectcalico.org/podIP": ""}),
        None,
        True,
        Reason.POD_RUNNING,
        id="blank-annotation-without-deletion",
    ),
    pytest.param(
        pod_ip(),
        N1,
        pod(deleting=True, annotations={"cni.projectcalico.org/podIPs": ""}),
        None,
        True,
        Reason.POD_RUNNING,
        id="deleting-plural-annotation-blank-does-not-finish",
    ),
    # 9. parsed comparison
    pytest.param(pod_ip(), N1, pod(), None, True, Reason.POD_RUNNING, id="running-match"),
    pytest.param(pod_ip(), N1, pod(phase="Pending"), None, True, Reason.POD_RUNNING, id="pending-match"),
    pytest.param(
        pod_ip(ip=V6),
        N1,
        pod(ips=("10.244.1.5", V6)),
        None,
        True,
        Reason.POD_RUNNING,
        id="dual-stack-second-ip",
    ),
    pytest.param(
        pod_ip(ip=V6),
        N1,
        pod(ips=("10.244.1.5", "fd00:10:244::6"), pod_ip="10.244.1.5"),
        None,
        False,
        Reason.POD_IP_MISMATCH,
        id="dual-stack-other-v6",
    ),
    pytest.param(
        pod_ip(ip=V6),
        N1,
        pod(ips=("fd00:10:244:0:0:0:0:5",)),
        None,
        True,
        Reason.POD_RUNNING,
        id="ipv6-exploded",
    ),
    pytest.param(
        pod_ip(ip="fd00:10:244:0:0:0:0:5"),
        N1,
        pod(ips=(V6,)),
        None,
        True,
        Reason.POD_RUNNING,
        id="alloc-exploded",
    ),
    pytest.param(
        pod_ip(ip=V6), N1, pod(ips=("FD00:10:244::5",)), None, True, Reason.POD_RUNNING, id="ipv6-upper-case"
    ),
    pytest.param(
        pod_ip(ip=V6),
        N1,
        pod(ips=("fd00:10:244::5/128",)),
        None,
        True,
        Reason.POD_RUNNING,
        id="ipv6-slash-128",
    ),
    pytest.param(
        pod_ip(), N1, pod(ips=("10.244.1.5/32",)), None, True, Reason.POD_RUNNING, id="ipv4-slash-32"
    ),
    pytest.param(
        pod_ip(), N1, pod(ips=("::ffff:10.244.1.5",)), None, True, Reason.POD_RUNNING, id="ipv4-mapped-ipv6"
    ),
    pytest.param(
        pod_ip(), N1, pod(ips=("10.244.1.50",)), None, False, Reason.POD_IP_MISMATCH, id="no-prefix-match"
    ),
    pytest.param(
        pod_ip(ip=V6),
        N1,
        pod(ips=("fd00:10:244::50",)),
        None,
        False,
        Reason.POD_IP_MISMATCH,
        id="no-v6-prefix-match",
    ),
    pytest.param(
        pod_ip(), N1, pod(ips=("10.244.1.6",)), None, False, Reason.POD_IP_MISMATCH, id="ip-mismatch"
    ),
    pytest.param(
        pod_ip(), N1, pod(ips=("10.244.1.999",)), None, True, Reason.POD_IP_UNPARSABLE, id="unparsable-pod-ip"
    ),
]


@pytest.mark.parametrize(("alloc", "knode", "pod_view", "kubevirt", "valid", "reason"), VALIDITY_CASES)
def test_allocation_validity(
    alloc: Allocation,
    knode: str,
    pod_view: PodView,
    kubevirt: KubeVirtView | Lookup | None,
    valid: bool,
    reason: Reason,
) -> None:
    v = allocation_validity(alloc, knode, pod_view, kubevirt)
    assert (v.valid, v.reason) == (valid, reason)


# The final re-check of a leak on a node that exists reads the pod live (§3.9): Calico then sees the
# deletion timestamp and `status.reason` its cache does not hold.
LIVE_VALIDITY_CASES = [
    pytest.param(
        pod(deleting=True, annotations={"cni.projectcalico.org/podIP": ""}),
        False,
        Reason.POD_TERMINATED,
        id="deleting-calico-annotation-blank",
    ),
    pytest.param(
        pod(deleting=True, annotations={"vpc.amazonaws.com/pod-ips": ""}),
        False,
        Reason.POD_TERMINATED,
        id="deleting-aws-annotation-blank",
    ),
    pytest.param(
        pod(deleting=True, annotations={"cni.projectcalico.org/podIPs": ""}),
        True,
        Reason.POD_RUNNING,
        id="deleting-plural-annotation-blank-does-not-finish",
    ),
    pytest.param(
        pod(ips=("10.244.1.999",), phase="Failed", reason="Evicted"),
        False,
        Reason.POD_EVICTED,
        id="evicted-decided-before-the-parse",
    ),
    pytest.param(
        pod(ips=("10.244.1.999",), phase="Succeeded"),
        True,
        Reason.POD_IP_UNPARSABLE,
        id="succeeded-unparsable",
    ),
    pytest.param(pod(), True, Reason.POD_RUNNING, id="running-match"),
]


@pytest.mark.parametrize(("pod_view", "valid", "reason"), LIVE_VALIDITY_CASES)
def test_allocation_validity_of_a_live_read(pod_view: PodView, valid: bool, reason: Reason) -> None:
    v = allocation_validity(pod_ip(), N1, pod_view, live=True)
    assert (v.valid, v.reason) == (valid, reason)


@pytest.mark.parametrize(
    "p",
    [
        pytest.param(
            pod(ips=(), annotations={"cni.projectcalico.org/podIPs": "garbage"}), id="no-ip-bad-annotation"
        ),
        pytest.param(pod(ips=("10.244.1.5", "10.244.1.999")), id="one-good-one-bad"),
        pytest.param(pod(ips=("fd00::zz",)), id="bad-v6"),
    ],
)
def test_unparsable_pod_ips_keep_the_allocation(p: Pod) -> None:
    """§3.7: no IP reported yet, or conversion/parse errors → valid (everything ambiguous keeps the IP)."""
    assert allocation_validity(pod_ip(), N1, p).valid
    assert allocation_validity(pod_ip(), "", p).valid
