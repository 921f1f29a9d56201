"""Every malformed shape of a Calico or Kubernetes object gets its own named error."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lab.cluster.ipam import CalicoIPAM
from lab.cluster.objects import node_object, pod_object
from shared import errors as e
from shared.model import sanitize_handle
from shared.parse import parse_affinity, parse_block, parse_handle, parse_node, parse_pod


def _cluster() -> CalicoIPAM:
    ipam = CalicoIPAM.with_pools()
    ipam.assign("node-1", "vxlan-tunnel-addr-node-1", {"node": "node-1", "type": "vxlanTunnelAddress"})
    ipam.assign("node-1", "k8s-pod-network.abc", {"node": "node-1", "namespace": "default", "pod": "web-0"})
    ipam.assign(
        "node-1", "k8s-pod-network.abc", {"node": "node-1", "namespace": "default", "pod": "web-0"}, version=6
    )
    return ipam


def _block() -> dict[str, Any]:
    return copy.deepcopy(_cluster().blocks["10.244.0.0/26"])


def test_valid_block_parses() -> None:
    b = parse_block(_block())
    assert b.name == "10-244-0-0-26"
    assert b.host == "node-1"
    assert len(b.allocations) == 64
    allocs = list(b.iter_allocations())
    assert [a.ip for a in allocs] == ["10.244.0.0", "10.244.0.1"]
    assert allocs[1].handle == "k8s-pod-network.abc"
    assert allocs[1].sequence_number == b.sequence_number_for_allocation[1]
    assert allocs[1].id == "k8s-pod-network.abc/10.244.0.1"
    assert not b.is_empty


def test_valid_v6_block_parses() -> None:
    raw = _cluster().blocks["fd00:10:244::/122"]
    b = parse_block(raw)
    assert b.name == "fd00-10-244---122"
    assert [a.ip for a in b.iter_allocations()] == ["fd00:10:244::"]


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(obj: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        cur = obj
        for p in parents:
            cur = cur[p]
        if value is _DELETE:
            del cur[last]
        else:
            cur[last] = value

    return mutate


_DELETE = object()


def _allocated_and_free(obj: dict[str, Any]) -> None:
    obj["spec"]["unallocated"].append(1)


def _index_out_of_range(obj: dict[str, Any]) -> None:
    obj["spec"]["allocations"][5] = 7


def _short_allocations(obj: dict[str, Any]) -> None:
    obj["spec"]["allocations"].pop()


def _non_string_handle(obj: dict[str, Any]) -> None:
    obj["spec"]["attributes"][1]["handle_id"] = 42


def _negative_seq(obj: dict[str, Any]) -> None:
    obj["spec"]["sequenceNumberForAllocation"]["1"] = -1


def _float_seq(obj: dict[str, Any]) -> None:
    obj["spec"]["sequenceNumber"] = 1.5


def _string_seq(obj: dict[str, Any]) -> None:
    obj["spec"]["sequenceNumber"] = "7"


def _bad_seq_key(obj: dict[str, Any]) -> None:
    obj["spec"]["sequenceNumberForAllocation"]["64"] = 1


def _free_out_of_range(obj: dict[str, Any]) -> None:
    obj["spec"]["unallocated"].append(64)


def _dup_free(obj: dict[str, Any]) -> None:
    obj["spec"]["unallocated"].append(obj["spec"]["unallocated"][0])


def _bool_index(obj: dict[str, Any]) -> None:
    obj["spec"]["allocations"][0] = True


def _bad_secondary(obj: dict[str, Any]) -> None:
    obj["spec"]["attributes"][1]["secondary"] = {"node": 3}


@pytest.mark.parametrize(
    ("mutate", "error"),
    [
        (_set("spec", _DELETE), e.MissingSpec),
        (_set("spec", "nope"), e.MissingSpec),
        (_set("metadata", _DELETE), e.MissingMetadata),
        (_set("metadata.name", 5), e.MissingMetadata),
        (_set("spec.cidr", "10.244.0.0"), e.BadCIDR),
        (_set("spec.cidr", "10.244.0.300/26"), e.BadCIDR),
        (_set("spec.cidr", 17), e.BadCIDR),
        (_set("spec.cidr", "10.244.0.5/26"), e.NonCanonicalCIDR),
        (_short_allocations, e.AllocationsLengthMismatch),
        (_set("spec.cidr", "10.244.0.0/25"), e.AllocationsLengthMismatch),
        (_index_out_of_range, e.AttributeIndexOutOfRange),
        (_allocated_and_free, e.OrdinalAllocatedAndFree),
        (_free_out_of_range, e.OrdinalOutOfRange),
        (_dup_free, e.DuplicateFreeOrdinal),
        (_non_string_handle, e.NonStringHandle),
        (_negative_seq, e.BadSequenceNumber),
        (_float_seq, e.BadSequenceNumber),
        (_string_seq, e.BadSequenceNumber),
        (_bad_seq_key, e.BadSequenceNumber),
        (_set("spec.affinity", "node:node-1"), e.UnknownAffinityPrefix),
        (_set("spec.affinity", "node-1"), e.UnknownAffinityPrefix),
        (_set("spec.affinity", "host:"), e.BadAffinity),
        (_set("spec.allocations", "all"), e.WrongFieldType),
        (_bool_index, e.WrongFieldType),
        (_bad_secondary, e.BadAttributes),
        (_set("spec.deleted", "yes"), e.WrongFieldType),
    ],
    ids=lambda v: getattr(v, "__name__", None) or str(v),
)
def test_malformed_block(mutate: Callable[[dict[str, Any]], None], error: type[e.MalformedObject]) -> None:
    obj = _block()
    mutate(obj)
    with pytest.raises(error) as info:
        parse_block(obj)
    assert info.value.kind == "IPAMBlock"
    assert str(info.value).startswith("IPAMBlock/")


def test_block_without_sequence_map_reads_zero() -> None:
    obj = _block()
    del obj["spec"]["sequenceNumberForAllocation"]
    assert all(a.sequence_number == 0 for a in parse_block(obj).iter_allocations())


def test_virtual_and_unaffine_blocks() -> None:
    obj = _block()
    obj["spec"]["affinity"] = "virtual:load-balancer"
    assert parse_block(obj).host is None
    obj["spec"]["affinity"] = None
    assert parse_block(obj).affinity_kind is None


def test_handle_and_affinity() -> None:
    ipam = _cluster()
    h = parse_handle(ipam.handles["k8s-pod-network.abc"])
    assert h.block == {"10.244.0.0/26": 1, "fd00:10:244::/122": 1}
    aff = parse_affinity(next(iter(ipam.affinities.values())))
    assert aff.state == "confirmed"
    assert aff.node == "node-1"
    assert not aff.deleted


@pytest.mark.parametrize(
    ("mutate", "error"),
    [
        (_set("spec.handleID", None), e.NonStringHandle),
        (_set("spec.handleID", 3), e.NonStringHandle),
        (_set("spec.block", {"10.244.0.0/26": "one"}), e.WrongFieldType),
        (_set("spec.block", {"10.244.0.1/26": 1}), e.BadCIDR),
        (_set("spec", _DELETE), e.MissingSpec),
    ],
)
def test_malformed_handle(mutate: Callable[[dict[str, Any]], None], error: type[e.MalformedObject]) -> None:
    obj = copy.deepcopy(_cluster().handles["k8s-pod-network.abc"])
    mutate(obj)
    with pytest.raises(error):
        parse_handle(obj)


@pytest.mark.parametrize(
    ("mutate", "error", "deleted"),
    [
        (_set("spec.type", "router"), e.UnknownAffinityPrefix, None),
        (_set("spec.cidr", "10.0.0.1/26"), e.BadCIDR, None),
        (_set("spec.node", ""), e.BadAffinity, None),
        (_set("spec.deleted", "maybe"), e.WrongFieldType, None),
        (_set("spec.deleted", "true"), None, True),
        (_set("spec.deleted", ""), None, False),
        (_set("spec.type", _DELETE), None, False),  # pre-existing rows without a type are host
    ],
)
def test_affinity_shapes(
    mutate: Callable[[dict[str, Any]], None], error: type[e.MalformedObject] | None, deleted: bool | None
) -> None:
    obj = copy.deepcopy(next(iter(_cluster().affinities.values())))
    mutate(obj)
    if error is not None:
        with pytest.raises(error):
            parse_affinity(obj)
    else:
        aff = parse_affinity(obj)
        assert aff.deleted is deleted
        assert aff.type == "host"


def test_pod_slimmed() -> None:
    raw = pod_object("default", "web-0", "node-1", ["10.244.0.1", "fd00:10:244::1"])
    raw["metadata"]["annotations"] = {"cni.projectcalico.org/podIP": "10.244.0.1/32", "other": "x"}
    raw["metadata"]["deletionTimestamp"] = "2025-01-21T17:51:44Z"
    pod = parse_pod(raw)
    assert pod.key == ("default", "web-0")
    assert pod.node_name == "node-1"
    assert pod.pod_ips == ("10.244.0.1", "fd00:10:244::1")
    assert pod.annotations == {"cni.projectcalico.org/podIP": "10.244.0.1/32"}
    assert pod.deletion_timestamp


@pytest.mark.parametrize(
    ("status", "error"),
    [
        ({"podIP": "10.244.0.999", "podIPs": [{"ip": "10.244.0.999"}]}, e.BadPodIP),
        ({"podIP": "10.244.0.1", "podIPs": [{"ip": "bogus"}]}, e.BadPodIP),
        ({"podIP": "10.244.0.1", "podIPs": ["10.244.0.1"]}, e.BadPodIP),
        ({"podIP": "10.244.0.1", "podIPs": "10.244.0.1"}, e.WrongFieldType),
        ({"phase": 3}, e.WrongFieldType),
    ],
)
def test_malformed_pod(status: dict[str, Any], error: type[e.MalformedObject]) -> None:
    raw = pod_object("default", "web-0", "node-1", [])
    raw["status"] = status
    with pytest.raises(error) as info:
        parse_pod(raw)
    assert info.value.name == "default/web-0"


def test_pod_needs_namespace_and_node_needs_name() -> None:
    raw = pod_object("default", "web-0", "node-1", [])
    del raw["metadata"]["namespace"]
    with pytest.raises(e.MissingMetadata):
        parse_pod(raw)
    with pytest.raises(e.MissingMetadata):
        parse_node({"kind": "Node", "metadata": {}})
    with pytest.raises(e.WrongFieldType):
        parse_node(["not", "an", "object"])
    assert parse_node(node_object("node-1", {"a": "b"})).labels["a"] == "b"


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.sampled_from(["k8s-pod-network.a", "k8s-pod-network.a\rold", "k8s-pod-network.b", "ipip"]),
        max_size=40,
    ),
    st.sets(st.integers(min_value=0, max_value=39)),
    st.sampled_from(["k8s-pod-network.a", "k8s-pod-network.a\rx", "k8s-pod-network.b", "ip", "absent"]),
)
def test_the_ips_of_a_handle_are_those_its_allocations_hold(
    handles: list[str], released: set[int], handle: str
) -> None:
    # `ips_of` (the leader's all-or-none check) against the allocations of the block, as Calico cuts handles.
    ipam = CalicoIPAM.with_pools()
    cidr = ipam.claim_block("node-1", 4)
    ips = [ipam.assign_in_block(cidr, h, {"node": "node-1"}) for h in handles]
    for i in sorted(released):
        if i < len(ips):
            ipam.release(ips[i])
    block = parse_block(copy.deepcopy(ipam.blocks[cidr]))
    want = sanitize_handle(handle)
    assert block.ips_of(handle) == [
        a.ip for a in block.iter_allocations() if sanitize_handle(a.handle) == want
    ]
