"""Assign and release as Calico's IPAM library does (spec §1.2, §3.13)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from lab.cluster.ipam import CalicoIPAM
from shared.blockops import (
    ReleaseConflict,
    ReleaseRequest,
    assign,
    deleted_by_release,
    library_empty,
    release,
)
from shared.parse import parse_block

POD = {"node": "node-1", "namespace": "default", "pod": "web-0"}


def _ipam() -> CalicoIPAM:
    ipam = CalicoIPAM.with_pools()
    ipam.assign("node-1", "vxlan-tunnel-addr-node-1", {"node": "node-1", "type": "vxlanTunnelAddress"})
    ipam.assign("node-1", "k8s-pod-network.a", POD)
    ipam.assign("node-1", "k8s-pod-network.b", {**POD, "pod": "web-1"})
    return ipam


def test_assign_pops_head_and_stamps_sequence_numbers() -> None:
    ipam = CalicoIPAM.with_pools()
    cidr = ipam.claim_block("node-1")
    spec = ipam.blocks[cidr]["spec"]
    start = spec["sequenceNumber"]
    new, ordinals = assign(spec, "h", POD, count=2)
    assert ordinals == [0, 1]
    assert new["unallocated"][0] == 2
    assert new["allocations"][:3] == [0, 0, None]
    assert new["sequenceNumberForAllocation"] == {"0": start, "1": start}
    assert new["sequenceNumber"] == start + 1
    assert spec["sequenceNumber"] == start, "assign must not mutate its input"


def test_release_frees_to_tail_compacts_and_bumps_sequence() -> None:
    ipam = _ipam()
    spec = ipam.blocks["10.244.0.0/26"]["spec"]
    seq = spec["sequenceNumberForAllocation"]["1"]
    out = release(spec, [ReleaseRequest("10.244.0.1", "k8s-pod-network.a", seq)])
    assert out.written
    assert out.released == ["10.244.0.1"]
    assert out.handle_counts == {"k8s-pod-network.a": 1}
    new = out.spec
    assert new["allocations"][1] is None
    assert new["unallocated"][-1] == 1
    assert "1" not in new["sequenceNumberForAllocation"]
    assert new["sequenceNumber"] == spec["sequenceNumber"] + 1
    # The attribute of handle a is gone and the others are renumbered, order kept.
    assert [a["handle_id"] for a in new["attributes"]] == ["vxlan-tunnel-addr-node-1", "k8s-pod-network.b"]
    assert new["allocations"][:3] == [0, None, 1]
    parse_block({**ipam.blocks["10.244.0.0/26"], "spec": new})  # still a valid block


def test_bad_sequence_number_fails_the_whole_block() -> None:
    ipam = _ipam()
    spec = ipam.blocks["10.244.0.0/26"]["spec"]
    good = spec["sequenceNumberForAllocation"]["2"]
    with pytest.raises(ReleaseConflict, match="sequence"):
        release(
            spec,
            [
                ReleaseRequest("10.244.0.2", "k8s-pod-network.b", good),
                ReleaseRequest("10.244.0.1", "k8s-pod-network.a", 12345),
            ],
        )


def test_bad_handle_fails_the_whole_block() -> None:
    ipam = _ipam()
    spec = ipam.blocks["10.244.0.0/26"]["spec"]
    with pytest.raises(ReleaseConflict, match="handle"):
        release(spec, [ReleaseRequest("10.244.0.1", "k8s-pod-network.zzz")])


def test_handle_compared_sanitised() -> None:
    ipam = _ipam()
    spec = copy.deepcopy(ipam.blocks["10.244.0.0/26"]["spec"])
    spec["attributes"][1]["handle_id"] = "k8s-pod-network.a\r\n"
    out = release(spec, [ReleaseRequest("10.244.0.1", "k8s-pod-network.a")])
    assert out.released == ["10.244.0.1"]


def test_already_free_needs_no_write_but_a_stale_seq_still_conflicts() -> None:
    ipam = _ipam()
    spec = ipam.blocks["10.244.0.0/26"]["spec"]
    out = release(spec, [ReleaseRequest("10.244.0.9", "x")])
    assert not out.written
    assert out.already_free == ["10.244.0.9"]
    # The sequence check runs first: a non-zero seq for a freed ordinal is a conflict (§3.13).
    with pytest.raises(ReleaseConflict):
        release(spec, [ReleaseRequest("10.244.0.9", "x", 99)])


def test_reused_ordinal_is_refused() -> None:
    """An IP released and re-allocated between decision and write must never be freed."""
    ipam = _ipam()
    cidr = "10.244.0.0/26"
    old_seq = ipam.blocks[cidr]["spec"]["sequenceNumberForAllocation"]["1"]
    ipam.release("10.244.0.1", "k8s-pod-network.a")
    # Drain the free list until ordinal 1 (now at the tail) is handed out again to a new pod.
    while True:
        ip = ipam.assign_in_block(cidr, "k8s-pod-network.new", {**POD, "pod": "new"})
        if ip == "10.244.0.1":
            break
    with pytest.raises(ReleaseConflict):
        release(ipam.blocks[cidr]["spec"], [ReleaseRequest("10.244.0.1", "k8s-pod-network.new", old_seq)])


def test_ipam_handles_and_unaffine_block_deletion() -> None:
    ipam = _ipam()
    ipam.assign("node-1", "k8s-pod-network.a", POD, version=6)
    assert ipam.handles["k8s-pod-network.a"]["spec"]["block"] == {"10.244.0.0/26": 1, "fd00:10:244::/122": 1}
    assert ipam.release_handle("k8s-pod-network.a") == ["10.244.0.1", "fd00:10:244::"]
    assert "k8s-pod-network.a" not in ipam.handles
    ipam.blocks["10.244.0.0/26"]["spec"]["affinity"] = None
    ipam.release_handle("k8s-pod-network.b")
    ipam.release_handle("vxlan-tunnel-addr-node-1")
    assert "10.244.0.0/26" not in ipam.blocks


def test_borrowing_when_the_pool_is_full() -> None:
    ipam = CalicoIPAM.with_pools("10.0.0.0/25", None)  # room for two /26 blocks
    for i in range(64):
        ipam.assign("node-1", f"h1-{i}", {"node": "node-1"})
    for i in range(64):
        ipam.assign("node-2", f"h2-{i}", {"node": "node-2"})
    ipam.release("10.0.0.5")
    ip = ipam.assign("node-3", "h3", {"node": "node-3"})
    assert ip == "10.0.0.5", "node-3 borrows the free ordinal of node-1's block"


# -- which release deletes its block (libcalico-go `releaseIPsFromBlock`: `b.empty() && b.Affinity == nil`) --

WIN = {"handle_id": "windows-reserved-ipam-handle", "secondary": {"note": "windows host rsvd"}}
POD_ATTR = {"handle_id": "k8s-pod-network.p", "secondary": {"namespace": "ns", "node": "node-y", "pod": "p"}}


def _literal_block(
    affinity: str | None, allocations: list[int | None], attributes: list[dict[str, Any]]
) -> dict[str, Any]:
    """A /29 IPAMBlock spec written out by hand (no builder), the way Calico stores it."""
    return {
        "cidr": "10.7.0.0/29",
        "affinity": affinity,
        "allocations": allocations,
        "unallocated": [o for o, a in enumerate(allocations) if a is None],
        "attributes": attributes,
        "sequenceNumber": 10,
        "sequenceNumberForAllocation": {str(o): 1 for o, a in enumerate(allocations) if a is not None},
        "deleted": False,
        "strictAffinity": False,
    }


# Ordinals 0, 1, 2 and 7 point at attribute 0 (what Windows reserves), ordinal 4 at attribute 1 (a pod's).
RESERVED_AND_POD = [0, 0, 0, None, 1, None, None, 0]
POD_ONLY = [None, None, None, None, 0, None, None, None]


@pytest.mark.parametrize(
    ("affinity", "allocations", "attributes", "deleted"),
    [
        pytest.param(None, RESERVED_AND_POD, [WIN, POD_ATTR], True, id="unaffine-only-windows-left"),
        pytest.param(
            None,
            RESERVED_AND_POD,
            [{**WIN, "handle_id": "Windows-Reserved-IPAM-Handle"}, POD_ATTR],
            True,
            id="handle-compared-case-insensitively",
        ),
        pytest.param("host:win-1", RESERVED_AND_POD, [WIN, POD_ATTR], False, id="affine-keeps-its-block"),
        pytest.param(
            "virtual:load-balancer", RESERVED_AND_POD, [WIN, POD_ATTR], False, id="virtual-affinity"
        ),
        pytest.param(None, RESERVED_AND_POD, [{"secondary": {}}, POD_ATTR], False, id="handle-less-ordinal"),
        pytest.param(
            None, RESERVED_AND_POD, [{"releasedAt": "2026-01-01T00:00:00Z"}, POD_ATTR], False, id="cooling"
        ),
        pytest.param(None, POD_ONLY, [POD_ATTR], True, id="unaffine-nothing-left"),
    ],
)
def test_a_release_deletes_an_unaffine_block_left_with_only_windows_reserved_ordinals(
    affinity: str | None, allocations: list[int | None], attributes: list[dict[str, Any]], deleted: bool
) -> None:
    spec = _literal_block(affinity, allocations, attributes)
    out = release(spec, [ReleaseRequest("10.7.0.4", "k8s-pod-network.p", 1)])
    assert out.released == ["10.7.0.4"]
    assert out.deletes_block is deleted
    assert deleted_by_release(out.spec) is deleted


def test_library_emptiness_ignores_windows_reserved_ordinals_the_gc_emptiness_does_not() -> None:
    spec = _literal_block("host:win-1", [0, 0, 0, None, None, None, None, 0], [WIN])
    assert library_empty(spec)
    assert not parse_block({"metadata": {"name": "10-7-0-0-29"}, "spec": spec}).is_empty
    assert not library_empty(_literal_block(None, [None, None, None, None, 0, None, None, None], [POD_ATTR]))
    assert library_empty(_literal_block(None, [None] * 8, []))


def test_a_release_that_frees_nothing_deletes_nothing() -> None:
    spec = _literal_block(None, [0, 0, 0, None, None, None, None, 0], [WIN])
    out = release(spec, [ReleaseRequest("10.7.0.4", "k8s-pod-network.p")])  # already free
    assert not out.written and not out.deletes_block  # nothing to write: Calico returns early
