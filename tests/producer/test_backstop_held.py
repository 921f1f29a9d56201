"""The backstop's sweep leaves an allocation alone only when the rules could not find it invalid: a pod
allocation whose IP the mirrored pod reports (`producer/heldips.py`) is valid whatever the node, the
phase, the annotations or the timers say (`shared/allocrules.py`)."""

from __future__ import annotations

import ipaddress
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from producer.heldips import V6, held_ips, ip_number
from shared.allocrules import allocation_validity
from shared.model import (
    ANNOTATION_AWS_POD_IPS,
    ANNOTATION_POD_IP,
    ANNOTATION_POD_IPS,
    ATTR_NAMESPACE,
    ATTR_NODE,
    ATTR_POD,
    Allocation,
    Pod,
)

IPS = ["10.0.0.1", "10.0.0.2", "fd00::1", "fd00::2", "10.0.0.01", "not-an-ip", "::ffff:10.0.0.1", ""]
ip_text = st.sampled_from(IPS)


@st.composite
def pods(draw: st.DrawFn) -> Pod:
    annotations = {
        name: ",".join(draw(st.lists(ip_text, max_size=2)))
        for name in draw(
            st.sets(st.sampled_from([ANNOTATION_POD_IPS, ANNOTATION_POD_IP, ANNOTATION_AWS_POD_IPS]))
        )
    }
    pod_ips = tuple(draw(st.lists(ip_text.filter(bool), max_size=2)))
    return Pod(
        namespace="ns",
        name="p",
        uid="u",
        node_name=draw(st.sampled_from(["", "node-a", "node-b"])),
        phase=draw(st.sampled_from(["Running", "Pending", "Succeeded", "Failed"])),
        reason=draw(st.sampled_from(["", "Evicted"])),
        pod_ip=draw(st.sampled_from(["", *pod_ips])),
        pod_ips=pod_ips,
        annotations=annotations,
        deletion_timestamp=draw(st.sampled_from(["", "2026-12-04T00:00:00Z"])),
        host_network=False,
    )


def _held(pod: Pod, ip: str) -> bool:
    held = held_ips(pod)
    n = ip_number(ip)
    if held is None or n is None:
        return False
    return n == held if isinstance(held, int) else n in held


@given(
    pods(),
    st.sampled_from(["10.0.0.1", "10.0.0.2", "fd00::1", "fd00::2"]),
    st.sampled_from(["", "node-a", "node-b"]),
)
def test_an_allocation_the_sweep_calls_held_is_valid_under_the_rules(pod: Pod, ip: str, knode: str) -> None:
    attrs = {ATTR_NAMESPACE: "ns", ATTR_POD: "p", ATTR_NODE: knode or "node-gone"}
    a = Allocation(ip, 1, "10.0.0.0/26" if ":" not in ip else "fd00::/122", "k8s-pod-network.x", attrs, 0)
    if _held(pod, ip):
        assert allocation_validity(a, knode, pod).valid


def test_ip_numbers_keep_the_families_apart_and_match_a_block_ordinal() -> None:
    assert ip_number("10.0.0.1") == int(ipaddress.ip_address("10.0.0.1"))
    assert ip_number("::a00:1") == int(ipaddress.ip_address("::a00:1")) | V6 != ip_number("10.0.0.1")
    assert ip_number("fd00::5") == (int(ipaddress.ip_network("fd00::/122").network_address) | V6) + 5
    assert ip_number("10.0.0.01") is None and ip_number("") is None


def test_a_finished_pod_or_one_without_ips_holds_nothing() -> None:
    base = Pod(namespace="ns", name="p", uid="u", node_name="n", phase="Running", pod_ip="10.0.0.1",
               pod_ips=("10.0.0.1",))  # fmt: skip
    assert held_ips(base) == ip_number("10.0.0.1")
    assert held_ips(replace(base, phase="Succeeded")) is None
    assert held_ips(replace(base, phase="Pending", pod_ip="", pod_ips=())) is None
    dual = replace(base, pod_ips=("10.0.0.1", "fd00::1"))
    assert held_ips(dual) == (ip_number("10.0.0.1"), ip_number("fd00::1"))
