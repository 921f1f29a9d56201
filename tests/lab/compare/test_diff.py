"""The comparison's verdict on hand-made outcomes: what differs, and which class each difference is.

Pure: no processes, no binary.  Facts come from `tests/scenarios.py`'s snapshots and `ClusterBuilder`;
outcomes are written by hand, as each collector would have left them."""

from __future__ import annotations

from typing import Any

import pytest

from lab.apiserver.store import Store
from lab.cluster.objects import ClusterBuilder
from lab.compare.diff import CLASSES, UNDECLARED, Difference, diff
from lab.compare.facts import AllocKey, ClusterFacts, facts_of
from lab.compare.recorder import Outcome, Recorder
from shared import blockops
from tests import scenarios

SLACK = 5.0


def _facts(name: str) -> tuple[ClusterFacts, set[str]]:
    doc, leaks = scenarios.SCENARIOS[name]()
    return facts_of(doc["items"]), leaks


def _key(facts: ClusterFacts, ip: str) -> AllocKey:
    (key,) = [k for k in facts.allocations if k[3] == ip]
    return key


def _outcome(name: str, released: dict[AllocKey, float] | None = None, **kw: Any) -> Outcome:
    return Outcome(name, released=dict(released or {}), ready=1.0, **kw)


def _only(diffs: list[Difference]) -> Difference:
    assert len(diffs) == 1, diffs
    return diffs[0]


def test_same_outcomes_within_the_slack_make_no_difference() -> None:
    facts, leaks = _facts("pod-deleted-without-cni-del")
    keys = {_key(facts, ip) for ip in leaks}
    calico = _outcome("calico", dict.fromkeys(keys, 6.0))
    ipamgc = _outcome("ipamgc", dict.fromkeys(keys, 6.0 + SLACK))  # exactly the slack apart: the same
    assert diff(facts, calico, ipamgc, SLACK) == []


def test_a_release_on_one_side_only_is_a_difference_with_its_truth() -> None:
    facts, leaks = _facts("pod-deleted-without-cni-del")
    (ip,) = leaks
    d = _only(diff(facts, _outcome("calico"), _outcome("ipamgc", {_key(facts, ip): 7.5}), SLACK))
    assert (d.kind, d.subject, d.what, d.calico, d.ipamgc) == ("allocation", ip, "ipamgc-only", None, 6.5)
    assert d.truth == "leaked (pod-missing)"
    assert (d.cls, d.status) == (UNDECLARED, UNDECLARED)


def test_a_late_release_beyond_the_slack_is_a_timing_difference() -> None:
    facts, leaks = _facts("pod-deleted-without-cni-del")
    key = _key(facts, next(iter(leaks)))
    d = _only(diff(facts, _outcome("calico", {key: 20.0}), _outcome("ipamgc", {key: 4.0}), SLACK))
    assert d.what == "calico-later" and d.cls == UNDECLARED


def test_times_are_measured_from_each_side_being_ready() -> None:
    facts, leaks = _facts("pod-deleted-without-cni-del")
    key = _key(facts, next(iter(leaks)))
    calico = Outcome("calico", released={key: 5.0}, ready=1.0)
    ipamgc = Outcome("ipamgc", released={key: 14.0}, ready=10.0)  # slower start, same latency
    assert diff(facts, calico, ipamgc, SLACK) == []


def test_stale_node_release_by_calico_is_the_declared_13538_fix() -> None:
    facts, _ = _facts("stale-node-attribute")
    (pod_ip,) = [k for k, a in facts.allocations.items() if a.detail == "pod-on-other-node"]
    d = _only(diff(facts, _outcome("calico", {pod_ip: 3.0}), _outcome("ipamgc"), SLACK))
    assert (d.cls, d.status, d.truth) == ("stale-node-fix", "deliberate", "in-use (pod-on-other-node)")


def test_the_same_stale_node_ip_released_by_ipamgc_is_undeclared() -> None:
    facts, _ = _facts("stale-node-attribute")
    (pod_ip,) = [k for k, a in facts.allocations.items() if a.detail == "pod-on-other-node"]
    assert _only(diff(facts, _outcome("calico"), _outcome("ipamgc", {pod_ip: 3.0}), SLACK)).cls == UNDECLARED


def test_a_leaked_sibling_of_a_valid_ip_released_by_calico_is_the_whole_handle_refusal() -> None:
    facts, _ = _facts("whole-handle-with-a-valid-member")
    (leaked,) = [k for k, a in facts.allocations.items() if a.detail == "pod-ip-mismatch"]
    d = _only(diff(facts, _outcome("calico", {leaked: 3.0}), _outcome("ipamgc"), SLACK))
    assert d.cls == "whole-handle-refusal"


def test_blanked_annotation_and_finished_malformed_ip_released_by_ipamgc() -> None:
    for name, cls in (
        ("terminating-pod-with-blanked-cni-annotation", "blanked-cni-annotation"),
        ("finished-pod-with-malformed-ip", "finished-pod-unparsable-ip"),
    ):
        facts, leaks = _facts(name)
        keys = {_key(facts, ip): 3.0 for ip in leaks}
        diffs = diff(facts, _outcome("calico"), _outcome("ipamgc", keys), SLACK)
        assert {d.cls for d in diffs} == {cls}
        assert CLASSES[cls].status in ("deliberate", "issue-35")


def test_which_empty_block_a_node_keeps() -> None:
    facts, _ = _facts("empty-blocks")
    node2 = [b.cidr for b in facts.node_blocks("node-2")]
    assert len(node2) == 2
    low, high = node2
    # Calico kept the higher block and released the lower; ipamgc the reverse: the declared choice
    diffs = diff(
        facts,
        _outcome("calico", blocks_deleted={low: 5.0}),
        _outcome("ipamgc", blocks_deleted={high: 5.0}),
        SLACK,
    )
    assert {(d.subject, d.cls) for d in diffs} == {
        (low, "lowest-empty-block-kept"),
        (high, "lowest-empty-block-kept"),
    }
    # ipamgc keeping the higher one is not what the README declares
    diffs = diff(
        facts,
        _outcome("calico", blocks_deleted={high: 5.0}),
        _outcome("ipamgc", blocks_deleted={low: 5.0}),
        SLACK,
    )
    assert {d.cls for d in diffs} == {UNDECLARED}
    # ipamgc keeping both where Calico kept one is a different count: undeclared
    diffs = diff(facts, _outcome("calico", blocks_deleted={low: 5.0}), _outcome("ipamgc"), SLACK)
    assert [d.cls for d in diffs] == [UNDECLARED]


def test_a_block_outside_every_selecting_pool_released_by_calico_is_ensure_consistent_affinity() -> None:
    facts, _ = _facts("pool-no-longer-selects-the-node")
    cidr = facts.node_blocks("node-1")[0].cidr
    assert not facts.blocks[cidr].in_pool
    d = _only(diff(facts, _outcome("calico", blocks_deleted={cidr: 9.0}), _outcome("ipamgc"), SLACK))
    assert d.cls == "ensure-consistent-affinity"


def test_a_cooling_block_released_by_calico_only_is_issue_35_item_5() -> None:
    facts, _ = _facts("cooldown-on-a-deleted-node")
    (cidr,) = [b.cidr for b in facts.blocks.values() if b.cooling]
    d = _only(diff(facts, _outcome("calico", blocks_deleted={cidr: 2.0}), _outcome("ipamgc"), SLACK))
    assert (d.cls, d.status) == ("cooldown-node-blocks", "issue-35")


def test_affinity_differences_carry_their_node() -> None:
    facts, _ = _facts("empty-blocks")
    name = next(n for n, a in facts.affinities.items() if a.node == "node-1")
    d = _only(diff(facts, _outcome("calico", affinities_deleted={name: 4.0}), _outcome("ipamgc"), SLACK))
    assert (d.kind, d.detail, d.truth) == ("affinity", "node-1", "node exists, block exists")


@pytest.mark.parametrize("cooldown", [0, 30])
def test_the_recorder_sees_releases_block_and_affinity_deletions(cooldown: int) -> None:
    cb = ClusterBuilder()
    cb.add_node("node-1", tunnel=None)
    handle, (ip,) = cb.add_pod("default", "web-0", "node-1")
    store = Store()
    for obj in cb.ipam.objects():
        plural = {"IPAMBlock": "ipamblocks", "IPAMHandle": "ipamhandles", "BlockAffinity": "blockaffinities"}
        store.create(plural[obj["kind"]], None, obj)
    rec = Recorder("x")
    store.add_hook(rec)
    rec.restart()
    cidr = cb.ipam.block_of(ip)
    name = blockops.cidr_to_name(cidr)
    block = store.get("ipamblocks", None, name)
    out = blockops.release(block["spec"], [blockops.ReleaseRequest(ip, handle)], cooldown=cooldown, now=1.0e9)
    block["spec"] = out.spec
    store.replace("ipamblocks", None, name, block)
    ordinal = next(iter(rec.outcome.released))[1]
    assert set(rec.outcome.released) == {(cidr, ordinal, handle, ip)}
    store.delete("ipamblocks", None, name)
    (aff,) = [a["metadata"]["name"] for a in store.list("blockaffinities")["items"]]
    store.delete("blockaffinities", None, aff)
    assert set(rec.outcome.blocks_deleted) == {cidr} and set(rec.outcome.affinities_deleted) == {aff}
    if cooldown:  # the block went with a cooling ordinal in it: that ordinal went too
        assert (cidr, ordinal, "", ip) in rec.outcome.released
    assert rec.outcome.writes == 3
