"""The rule catalogue, empty blocks (§3.10, §3.11, §8.16–18, §8.22): when an empty host-affine block is
released, and an unaffine block its releases leave with Windows-reserved ordinals only."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest

from shared.model import IPAMBlock
from shared.rules import evaluate_empty_block, evaluate_unaffine_block
from shared.verdicts import Reason, Release
from tests.shared.catalogue_helpers import LGP, MIGRATION, N1, NS, T0, _block

# ----------------------------------------------------------------------------------------------------
# Empty blocks (§3.10, §3.11, §8.16–18, §8.22)

EMPTY = _block()
POD_ATTR = {"handle_id": "k8s-pod-network.x", "secondary": {"node": N1, "namespace": NS, "pod": "web-0"}}
WINDOWS_ATTR = {"handle_id": "windows-reserved-ipam-handle", "secondary": {"note": "windows host rsvd"}}
COOLDOWN_ATTR = {"releasedAt": "2026-01-01T00:00:00Z"}


@dataclass(frozen=True)
class BlockCase:
    block: IPAMBlock
    release: Release | None  # None: not an empty host-affine block at all
    reason: Reason | None = None
    node_exists: bool = True
    node_releasable: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)
    affine_blocks: int = 2
    grace: float | None = LGP
    first_empty: float | None = T0
    now: float = T0 + LGP + 1


BLOCK_CASES = [
    pytest.param(BlockCase(EMPTY, Release.NOW, Reason.EMPTY_BLOCK), id="empty-after-grace-released"),
    pytest.param(
        BlockCase(EMPTY, Release.AFTER_GRACE, Reason.EMPTY_BLOCK, now=T0 + LGP),
        id="empty-exactly-grace-not-enough",
    ),
    pytest.param(
        BlockCase(EMPTY, Release.AFTER_GRACE, Reason.EMPTY_BLOCK, now=T0 + 200, grace=300.0),
        id="fv-lgp-5m-not-within-grace",
    ),
    pytest.param(
        BlockCase(EMPTY, Release.NOW, Reason.EMPTY_BLOCK, now=T0 + 301, grace=300.0),
        id="fv-lgp-5m-after-grace",
    ),
    pytest.param(
        BlockCase(EMPTY, Release.AFTER_GRACE, Reason.EMPTY_BLOCK, first_empty=None, now=T0),
        id="first-observation-starts-timer",
    ),
    pytest.param(
        BlockCase(EMPTY, Release.NOW, Reason.EMPTY_BLOCK, affine_blocks=5),
        id="other-blocks-full-still-released",
    ),
    pytest.param(
        BlockCase(EMPTY, Release.NEVER, Reason.LAST_BLOCK, affine_blocks=1, now=T0 + 100 * LGP),
        id="never-a-live-nodes-last-block",
    ),
    pytest.param(
        BlockCase(EMPTY, Release.NEVER, Reason.BLOCK_GC_DISABLED, grace=None), id="lgp-unset-block-gc-off"
    ),
    pytest.param(
        BlockCase(EMPTY, Release.NEVER, Reason.BLOCK_GC_DISABLED, grace=0.0), id="lgp-0-block-gc-off"
    ),
    pytest.param(
        BlockCase(EMPTY, Release.NEVER, Reason.NODE_MIGRATING, labels={MIGRATION: "flannel"}),
        id="flannel-migration-in-progress",
    ),
    pytest.param(
        BlockCase(EMPTY, Release.NEVER, Reason.NODE_MIGRATING, labels={MIGRATION: ""}),
        id="flannel-migration-label-empty",
    ),
    pytest.param(
        BlockCase(EMPTY, Release.NOW, Reason.EMPTY_BLOCK, labels={MIGRATION: "calico"}),
        id="flannel-migration-done-calico",
    ),
    pytest.param(
        BlockCase(EMPTY, Release.NOW, Reason.EMPTY_BLOCK, labels={"other": "flannel"}), id="unrelated-label"
    ),
    # a deleted node that is releasable takes its empty blocks with its affinities, at once
    *(
        pytest.param(
            BlockCase(
                EMPTY,
                Release.NOW,
                Reason.NODE_MISSING,
                node_exists=False,
                node_releasable=True,
                affine_blocks=n,
                grace=g,
                first_empty=None,
                now=T0,
            ),
            id=f"deleted-node-empty-block-now-grace-{g}-blocks-{n}",
        )
        for g, n in ((None, 1), (0.0, 1), (LGP, 2))
    ),
    pytest.param(
        BlockCase(EMPTY, Release.NEVER, Reason.LAST_BLOCK, node_exists=False, affine_blocks=1),
        id="deleted-node-not-releasable-last-block",
    ),
    pytest.param(
        BlockCase(EMPTY, Release.NOW, Reason.EMPTY_BLOCK, node_exists=False),
        id="deleted-node-not-releasable-after-grace",
    ),
    # only empty host-affine blocks are considered at all
    pytest.param(BlockCase(_block(affinity="virtual:load-balancer"), None), id="virtual-affinity"),
    pytest.param(BlockCase(_block(affinity=None), None), id="unaffine"),
    pytest.param(
        BlockCase(_block(affinity=None), None, node_exists=False, node_releasable=True), id="unaffine-gone"
    ),
    pytest.param(BlockCase(_block(used={5: POD_ATTR}), None), id="non-empty"),
    pytest.param(BlockCase(_block(used={0: WINDOWS_ATTR, 1: WINDOWS_ATTR}), None), id="windows-reserved"),
    pytest.param(
        BlockCase(_block(used={0: WINDOWS_ATTR}), None, node_exists=False, node_releasable=True),
        id="windows-reserved-gone-node",
    ),
    pytest.param(BlockCase(_block(used={7: COOLDOWN_ATTR}), None), id="cooldown-ordinal"),
    pytest.param(
        BlockCase(_block("10.244.9.7/32"), Release.NOW, Reason.EMPTY_BLOCK), id="small-slash-32-block"
    ),
    pytest.param(BlockCase(_block("fd00:10:244::40/122"), Release.NOW, Reason.EMPTY_BLOCK), id="ipv6-block"),
]


@pytest.mark.parametrize("case", BLOCK_CASES)
def test_evaluate_empty_block(case: BlockCase) -> None:
    ev = evaluate_empty_block(
        case.block,
        case.node_exists,
        case.node_releasable,
        case.labels,
        case.affine_blocks,
        case.grace,
        case.first_empty,
        case.now,
    )
    if case.release is None:
        assert ev is None
        return
    assert ev is not None
    assert (ev.block, ev.node) == (case.block.cidr_str, N1)
    assert (ev.release, ev.reason) == (case.release, case.reason)


# An unaffine block its releases leave with nothing but Windows-reserved ordinals is deleted with the last
# of them (§3.13, libcalico-go `releaseIPsFromBlock`: `b.empty() && b.Affinity == nil`).
WIN_AND_POD = {0: WINDOWS_ATTR, 1: WINDOWS_ATTR, 2: WINDOWS_ATTR, 63: WINDOWS_ATTR, 5: POD_ATTR}
WIN_UPPER = {**WINDOWS_ATTR, "handle_id": "Windows-Reserved-IPAM-Handle"}
NOW, LATER, NEVER = Release.NOW, Release.AFTER_GRACE, Release.NEVER


@pytest.mark.parametrize(
    ("block", "releases", "fate"),
    [
        pytest.param(_block(affinity=None, used=WIN_AND_POD), {5: NOW}, NOW, id="reserved-left-now"),
        pytest.param(_block(affinity=None, used=WIN_AND_POD), {5: LATER}, LATER, id="reserved-left-later"),
        pytest.param(_block(affinity=None, used=WIN_AND_POD), {5: NEVER}, None, id="ip-kept"),
        pytest.param(_block(affinity=None, used=WIN_AND_POD), {}, None, id="no-verdict-kept"),
        pytest.param(_block(affinity=None, used={0: WIN_UPPER, 5: POD_ATTR}), {5: NOW}, NOW, id="any-case"),
        pytest.param(
            _block(affinity=None, used={5: POD_ATTR, 6: POD_ATTR}), {5: NOW, 6: LATER}, LATER, id="latest"
        ),
        pytest.param(
            _block(affinity=None, used={5: POD_ATTR, 7: COOLDOWN_ATTR}), {5: NOW}, None, id="cooling"
        ),
        pytest.param(_block(affinity=None, used={0: WINDOWS_ATTR}), {}, None, id="only-reserved-left-alone"),
        pytest.param(_block(affinity=None), {}, None, id="empty-left-alone"),
        pytest.param(_block(used=WIN_AND_POD), {5: NOW}, None, id="host-affine"),
        pytest.param(
            _block(affinity="virtual:load-balancer", used=WIN_AND_POD), {5: NOW}, None, id="virtual"
        ),
    ],
)
def test_evaluate_unaffine_block(
    block: IPAMBlock, releases: dict[int, Release], fate: Release | None
) -> None:
    ev = evaluate_unaffine_block(block, releases)
    if fate is None:
        assert ev is None
        return
    assert ev is not None
    assert (ev.block, ev.node, ev.release, ev.reason) == (block.cidr_str, "", fate, Reason.UNAFFINE_BLOCK)


def test_empty_block_needs_two_observations_more_than_grace_apart() -> None:
    first = evaluate_empty_block(EMPTY, True, False, {}, 2, LGP, None, T0)
    assert first is not None
    assert (first.release, first.first_empty) == (Release.AFTER_GRACE, T0)
    same = evaluate_empty_block(EMPTY, True, False, {}, 2, LGP, first.first_empty, T0 + LGP)
    assert same is not None
    assert (same.release, same.first_empty) == (Release.AFTER_GRACE, T0)
    later = evaluate_empty_block(EMPTY, True, False, {}, 2, LGP, first.first_empty, T0 + LGP + 0.001)
    assert later is not None
    assert later.release is Release.NOW


def test_migrating_node_clears_the_empty_timer() -> None:
    ev = evaluate_empty_block(EMPTY, True, False, {MIGRATION: "flannel"}, 2, LGP, T0, T0 + 2 * LGP)
    assert ev is not None
    assert (ev.release, ev.first_empty) == (Release.NEVER, None)
