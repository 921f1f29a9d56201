"""Properties of the validity rules that must hold for every input, not only the catalogued ones.

(a) An IP that an existing, non-terminal pod reports is never released, whatever the allocation's `node`
    attribute (#12257), the node's existence, the grace period and the timers.
(b) Nothing is confirmed on a live node before its grace period has passed (strictly).
(c) A handle with any valid IP releases none of its IPs (#5044).
(d) Verdicts do not depend on the order in which a node's allocations are given.

Each is checked on the pure rules (`evaluate_node`, `handle_release`) and, where it applies, end to end
through `audit` on an inventory built the way Calico's CNI plugin writes IPAM data (`ClusterBuilder`).

This module checks them on the pure rules; `test_rules_properties_audit.py` end to end through `audit`.
"""

from __future__ import annotations

from typing import Any

from hypothesis import assume, given
from hypothesis import strategies as st

from shared.model import AllocationID, Pod
from shared.rules import NodeVerdict, evaluate_node, handle_release
from shared.verdicts import AllocationType, LeakState, PodView, Release
from tests.shared.properties_helpers import (
    HANDLES,
    NODES,
    NON_TERMINAL_PHASES,
    NS,
    POD_NAMES,
    SETTINGS,
    V4,
    V6,
    NodeScene,
    _alloc,
    _finished,
    _lookup_in,
    _spellings,
    addresses,
    graces,
    node_scenes,
    pod_views,
    times,
)

# ----------------------------------------------------------------------------------------------------
# (a) a reported IP of a live pod is never released


@SETTINGS
@given(data=st.data(), scene=node_scenes(), ip_index=st.integers(0, 63), v6=st.booleans())
def test_a_ip_reported_by_a_live_pod_is_never_released(
    data: st.DataObject, scene: NodeScene, ip_index: int, v6: bool
) -> None:
    ip = (V6 if v6 else V4).network_address + ip_index
    assume(all(a.ip != str(ip) for a in scene.allocations))
    handle = data.draw(st.sampled_from(HANDLES), label="handle")
    name = data.draw(st.sampled_from(POD_NAMES), label="pod")
    target = _alloc(ip, handle, {"node": scene.node, "namespace": NS, "pod": name, "timestamp": "t"})
    others = [data.draw(st.sampled_from((str(ip), "10.244.9.9", "fd00:10:244:9::9"))) for _ in range(2)]
    reported = [*others, data.draw(_spellings(ip), label="spelling")]
    reported = data.draw(st.permutations(reported), label="reported")
    owner = Pod(
        namespace=NS,
        name=name,
        node_name=data.draw(st.sampled_from((*NODES, "")), label="pod node"),
        phase=data.draw(st.sampled_from(NON_TERMINAL_PHASES), label="phase"),
        reason=data.draw(st.sampled_from(("", "Evicted")), label="reason"),
        pod_ip=data.draw(st.sampled_from(("", *reported)), label="podIP"),
        pod_ips=tuple(reported),
        annotations=data.draw(
            st.dictionaries(
                st.sampled_from(("cni.projectcalico.org/podIP", "vpc.amazonaws.com/pod-ips", "x/y")),
                st.sampled_from(("10.244.1.5/32", str(ip))),
                max_size=2,
            ),
            label="annotations",
        ),
        deletion_timestamp=data.draw(st.booleans(), label="deleting"),
    )
    assert not _finished(owner)
    pods = {**scene.pods, (NS, name): owner}
    allocations = data.draw(st.permutations([*scene.allocations, target]), label="order")
    timers = dict(scene.timers)
    timers[target.id] = data.draw(st.floats(min_value=0, max_value=scene.now), label="first seen")

    nv = evaluate_node(
        scene.node,
        scene.node_exists,
        allocations,
        _lookup_in(pods),
        timers,
        scene.grace,
        scene.now,
        scene.kubevirt,
    )
    (verdict,) = [v for v in nv.verdicts if v.allocation.id == target.id]
    assert verdict.valid
    assert verdict.state is LeakState.VALID
    assert verdict.first_seen is None
    states = [v.state for v in nv.verdicts if v.allocation.handle == handle]
    assert handle_release(states) is Release.NEVER
    if not scene.node_exists:
        assert not nv.releasable  # a node still holding a live pod's IP is never cleaned up


# ----------------------------------------------------------------------------------------------------
# (b) nothing is confirmed on a live node before the grace period has passed


@SETTINGS
@given(data=st.data(), scene=node_scenes(node_exists=True))
def test_b_nothing_confirmed_on_a_live_node_within_grace(data: st.DataObject, scene: NodeScene) -> None:
    grace = scene.grace if scene.grace is not None else data.draw(st.floats(0, 7200), label="grace")
    timers: dict[AllocationID, float] = {}
    for a in scene.allocations:
        if data.draw(st.booleans(), label="has timer"):
            within = st.floats(min_value=-100, max_value=grace, allow_nan=False)
            elapsed = data.draw(st.one_of(st.just(grace), within), label="elapsed")  # boundary included
            first = scene.now - elapsed
            assume(scene.now - first <= grace)
            timers[a.id] = first
    # Only the drawn grace bounds the timers: with an unset grace, VM allocations still wait their own
    # 5-minute floor, which a timer drawn within `grace` may already have passed.
    for g in (grace,):
        nv = evaluate_node(
            scene.node, True, scene.allocations, scene.lookup, timers, g, scene.now, scene.kubevirt
        )
        assert not nv.releasable
        for v in nv.verdicts:
            assert v.state is not LeakState.CONFIRMED, v
            if v.state is LeakState.CANDIDATE:
                assert v.first_seen == timers.get(v.allocation.id, scene.now)
            assert handle_release([v.state]) is not Release.NOW


@SETTINGS
@given(scene=node_scenes(node_exists=True, min_size=1), elapsed=st.floats(0, 1e6), grace=graces)
def test_b_a_candidate_is_confirmed_exactly_when_its_grace_has_passed(
    scene: NodeScene, elapsed: float, grace: float | None
) -> None:
    """The other half: on a live node, a non-VM leak is confirmed iff grace > 0 and elapsed > grace."""
    first = scene.now - elapsed
    timers = {a.id: first for a in scene.allocations}
    nv = evaluate_node(
        scene.node, True, scene.allocations, scene.lookup, timers, grace, scene.now, scene.kubevirt
    )
    for v in nv.verdicts:
        if v.valid or v.type is not AllocationType.POD:
            continue
        if grace is None:
            assert v.state is LeakState.IGNORED
        elif grace > 0 and scene.now - first > grace:
            assert v.state is LeakState.CONFIRMED
        else:
            assert v.state is LeakState.CANDIDATE


# ----------------------------------------------------------------------------------------------------
# (c) a handle with any valid IP releases none of its IPs


@SETTINGS
@given(data=st.data(), grace=graces, now=times)
def test_c_handle_with_a_valid_ip_releases_nothing(
    data: st.DataObject, grace: float | None, now: float
) -> None:
    """One handle's IPs spread over up to three nodes (dual-stack, KubeVirt live migration); one is valid."""
    handle = "k8s-pod-network.shared"
    ips = data.draw(addresses(min_size=2, max_size=6), label="ips")
    states: list[LeakState] = []
    valid_ip = data.draw(st.sampled_from(ips), label="valid ip")
    for node in NODES:
        mine = [ip for i, ip in enumerate(ips) if NODES[i % len(NODES)] == node]
        if not mine:
            continue
        allocations = []
        pods: dict[tuple[str, str], PodView] = {}
        for ip in mine:
            # One pod per IP: a name from the IP's value could repeat (10.244.1.4 and fd00::…04 share
            # `int(ip) % 1000`), and the valid IP's pod would then be replaced by another drawn pod.
            name = f"p-{ips.index(ip)}"
            allocations.append(_alloc(ip, handle, {"node": node, "namespace": NS, "pod": name}))
            if ip == valid_ip:
                pods[(NS, name)] = Pod(
                    NS, name, node_name=node, phase="Running", pod_ip=str(ip), pod_ips=(str(ip),)
                )
            else:
                pods[(NS, name)] = data.draw(pod_views(name, mine), label="pod")
        exists = data.draw(st.booleans(), label="node exists")
        timers = {a.id: data.draw(st.floats(0, now), label="first") for a in allocations}
        lookup = _lookup_in(pods)
        nv = evaluate_node(node, exists, allocations, lookup, timers, grace, now)
        states.extend(v.state for v in nv.verdicts)
    assert LeakState.VALID in states
    assert handle_release(states) is Release.NEVER


# ----------------------------------------------------------------------------------------------------
# (d) verdicts never depend on the order of a node's allocations


def _verdict_map(nv: NodeVerdict) -> dict[AllocationID, tuple[Any, ...]]:
    return {v.allocation.id: (v.type, v.valid, v.reason, v.state, v.first_seen) for v in nv.verdicts}


@SETTINGS
@given(data=st.data(), scene=node_scenes())
def test_d_verdicts_do_not_depend_on_allocation_order(data: st.DataObject, scene: NodeScene) -> None:
    shuffled = data.draw(st.permutations(scene.allocations), label="order")
    first, second = scene.evaluate(), scene.evaluate(allocations=shuffled)
    assert len(first.verdicts) == len(second.verdicts) == len(scene.allocations)
    assert _verdict_map(first) == _verdict_map(second)
    assert first.releasable is second.releasable
    reversed_ = scene.evaluate(allocations=tuple(reversed(scene.allocations)))
    assert _verdict_map(first) == _verdict_map(reversed_)
    assert first.releasable is reversed_.releasable
