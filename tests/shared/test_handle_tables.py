"""The leader's scan keeps handles and holdings in compact tables (shared/handletables.py): they must give
back exactly what the plain dicts held, and so the same judgement, whatever the handles and blocks."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from ipaddress import ip_network

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.consistency import add_holdings, divergences
from shared.handletables import CIDR_SLOTS, HandleTable, HoldingTable, unsettled
from shared.model import Attribute, IPAMBlock, IPAMHandle

CIDRS = ("10.244.0.0/30", "10.244.0.4/30", "fd00::/126")
POD = "k8s-pod-network." + "0123456789abcdef" * 4  # a pod's handle: kept under the 32 bytes its digits spell
IDS = ("h1", "H1", "h2", "h3", "windows-reserved-ipam-handle", "a/b", "", POD, POD.upper(), POD[:-1] + "g")


def _block(cidr: str, handles: list[str | None]) -> IPAMBlock:
    attrs = tuple(Attribute(h) for h in handles)
    allocations = tuple(range(len(handles))) + (None,) * (4 - len(handles))
    return IPAMBlock(
        name=cidr.replace("/", "-").replace(".", "-").replace(":", "-"),
        cidr=ip_network(cidr),
        affinity="host:node-a",
        allocations=allocations,
        unallocated=tuple(range(len(handles), 4)),
        attributes=attrs,
        sequence_number=0,
        sequence_number_for_allocation={},
    )


blocks = st.lists(
    st.tuples(st.sampled_from(CIDRS), st.lists(st.one_of(st.none(), st.sampled_from(IDS)), max_size=4)),
    max_size=4,
    unique_by=lambda b: b[0],
)
handles = st.lists(
    st.builds(
        lambda hid, counts, deleted, rv: IPAMHandle(
            name=hid.lower(), handle_id=hid, block=counts, deleted=deleted, resource_version=rv
        ),
        st.sampled_from([i for i in IDS if i]),
        st.dictionaries(st.sampled_from(CIDRS), st.integers(0, 3), max_size=3),
        st.booleans(),
        st.sampled_from(["1", "27", "", "0", "007", "12a", "²"]),
    ),
    max_size=6,
)


@settings(max_examples=300, deadline=None)
@given(blocks, handles)
def test_the_tables_hold_what_the_dicts_hold_and_judge_alike(
    raw_blocks: list[tuple[str, list[str | None]]], raw_handles: list[IPAMHandle]
) -> None:
    plain_handles: dict[str, IPAMHandle] = {}
    table = HandleTable()
    for h in raw_handles:
        plain_handles[h.name] = h
        table.add(h)
    plain_holdings: dict = {}  # type: ignore[type-arg]
    held = HoldingTable(table)  # as the scan keeps them: a usual handle's one holding is its bit
    alone = HoldingTable()
    for cidr, ids in raw_blocks:
        block = _block(cidr, ids)
        add_holdings(plain_holdings, block)
        held.add_block(block)
        alone.add_block(block)
    assert dict(table.items()) == plain_handles and len(table) == len(plain_handles)
    for holdings in (held, alone):
        assert dict(holdings.items()) == plain_holdings and len(holdings) == len(plain_holdings)
        assert all(n in holdings for n in plain_holdings) and "absent" not in holdings
    assert all(n in table for n in plain_handles) and "absent" not in table and table.get("absent") is None
    judged = divergences(plain_holdings, plain_handles, {"h3"})
    assert divergences(held, table, {"h3"}) == judged
    assert divergences(held, table, {"h3"}, unsettled(table, held)) == judged
    assert divergences(alone, table, {"h3"}, unsettled(table, alone)) == judged
    held.clear()  # a list of blocks started again: the bits go too
    assert not held and dict(table.items()) == plain_handles


def _traced(build: Callable[[], object]) -> tuple[object, int]:
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = build()
        return kept, tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def test_a_scan_of_usual_handles_keeps_well_under_half_the_memory_of_the_plain_dicts() -> None:
    # Handle names as a real cluster's (`k8s-pod-network.` + 64 hex digits), parsed fresh from JSON as the
    # scan's are; one ordinal each in 64-ordinal blocks.
    raw = [f"k8s-pod-network.{i:064x}" for i in range(4000)]
    cidrs = [f"10.{i // 256}.{i % 256}.0/26" for i in range(len(raw) // 64 + 1)]

    def parsed() -> list[IPAMHandle]:
        return [
            IPAMHandle(
                name=n.upper().lower(),
                handle_id=n.upper().lower(),
                block={cidrs[i // 64]: 1},
                resource_version=str(i),
            )
            for i, n in enumerate(raw)
        ]

    def plain() -> object:
        return {h.name: h for h in parsed()}

    def compact() -> object:
        table = HandleTable()
        for h in parsed():
            table.add(h)
        return table

    kept_plain, plain_bytes = _traced(plain)
    kept_compact, compact_bytes = _traced(compact)
    assert dict(kept_compact.items()) == kept_plain  # type: ignore[attr-defined]
    assert compact_bytes < 0.6 * plain_bytes, (compact_bytes, plain_bytes)
    held = HoldingTable()
    held.add_block(_block("10.244.0.0/30", ["h", "K"]))
    assert held["h"].counts == {"10.244.0.0/30": 1} and held["k"].handle_id == "K"
    held.clear()
    assert not held


@pytest.mark.parametrize("attached", [True, False])
def test_only_the_pairs_that_can_disagree_are_left_to_judge(attached: bool) -> None:
    """A usual handle whose blocks hold exactly its one ordinal is settled; a handle held elsewhere, held
    twice, deleted, or not held, and a holding without a handle, are not."""
    table = HandleTable()
    held = HoldingTable(table) if attached else HoldingTable()
    for name, cidr in [("ok", "10.244.0.0/30"), ("moved", "10.244.0.0/30"), ("twice", "10.244.0.4/30")]:
        table.add(IPAMHandle(name=name, handle_id=name, block={cidr: 1}, resource_version="7"))
    table.add(
        IPAMHandle(name="orphan", handle_id="orphan", block={"10.244.0.0/30": 1}, resource_version="08")
    )
    table.add(IPAMHandle(name="gone", handle_id="gone", block={"10.244.0.0/30": 1}, deleted=True))
    held.add_block(_block("10.244.0.0/30", ["ok", "twice", "missing", "gone"]))
    held.add_block(_block("10.244.0.4/30", ["moved", "twice"]))
    assert sorted(unsettled(table, held)) == ["gone", "missing", "moved", "orphan", "twice"]
    assert {d.name for d in divergences(held, table, (), unsettled(table, held))} == {
        "gone",
        "missing",
        "moved",
        "orphan",
        "twice",
    }
    assert table["ok"].resource_version == "7" and table["orphan"].resource_version == "08"


def test_a_usual_handle_keeps_its_resource_version_and_cidr_exactly() -> None:
    table = HandleTable()
    for rv in ("0", "1", "9007199254740993", str(CIDR_SLOTS), "", "01"):
        h = IPAMHandle(name=f"h{rv}", handle_id=f"h{rv}", block={"fd00::/122": 1}, resource_version=rv)
        table.add(h)
        assert table[h.name] == h
