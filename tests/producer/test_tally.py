"""Calico's IPAM gauges kept incrementally: per-block semantics (spec §7), and a property — after any
sequence of block changes and pool changes the incremental totals equal a from-scratch computation."""

from __future__ import annotations

import ipaddress
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from producer.ippools import IPPool, parse_ippools, pool_of_block, pool_of_ip
from producer.tally import BlockTally
from shared.blockrecords import BlockRecord, Slot

V4 = IPPool("default-ipv4-ippool", ipaddress.ip_network("10.64.0.0/16"))
V6 = IPPool("default-ipv6-ippool", ipaddress.ip_network("fd00:10::/104"))
INNER = IPPool("inner", ipaddress.ip_network("10.64.8.0/22"))


def record(host: str | None, nodes: list[str | None]) -> BlockRecord:
    """A block with one allocation per entry of `nodes` (None: no `node` attribute)."""
    slots = {
        i: Slot(f"h{i}", i, {"node": n} if n is not None else {"type": "legacy"}) for i, n in enumerate(nodes)
    }
    return BlockRecord("1", "uid", host, len(nodes), slots)


def test_calico_semantics_per_block() -> None:
    tally = BlockTally([V4, V6])
    tally.observe("10.64.1.0/26", record("a", ["a", "a", "b", None]))  # one borrowed (b), one unknown
    tally.observe("10.99.0.0/26", record(None, ["c"]))  # outside every pool, unaffine
    tally.observe("fd00:10::/122", record("a", ["a"]))
    t = tally.totals()
    assert t.in_use == {
        (V4.name, "a"): 2,
        (V4.name, "b"): 1,
        (V4.name, "unknown_node"): 1,
        ("no_ippool", "c"): 1,
        (V6.name, "a"): 1,
    }
    assert t.borrowed == {(V4.name, "b"): 1, ("no_ippool", "c"): 1}  # an unaffine block lends everything
    assert t.blocks == {(V4.name, "a"): 1, ("no_ippool", "no_affinity"): 1, (V6.name, "a"): 1}

    # An update replaces the block's contribution; a delete removes it; an empty block still counts.
    tally.observe("10.64.1.0/26", record("a", []))
    tally.observe("10.99.0.0/26", None)
    t = tally.totals()
    assert t.in_use == {(V6.name, "a"): 1}
    assert t.borrowed == {}
    assert t.blocks == {(V4.name, "a"): 1, (V6.name, "a"): 1}


def test_pools_regroup_blocks_and_the_most_specific_pool_wins() -> None:
    tally = BlockTally()
    tally.observe("10.64.8.0/26", record("a", ["a"]))
    assert tally.totals().in_use == {("no_ippool", "a"): 1}
    assert tally.set_pools([V4, INNER])
    assert tally.totals().in_use == {("inner", "a"): 1}
    assert not tally.set_pools([INNER, V4])  # same pools: nothing to do
    assert pool_of_block("10.64.0.0/26", [V4, INNER]) == V4.name
    assert pool_of_ip("10.64.9.3", [V4, INNER]) == "inner"
    assert pool_of_ip("192.168.0.1", [V4]) == "no_ippool"
    assert pool_of_block("not a cidr", [V4]) == "no_ippool"


def test_counts_told_again_after_a_record_are_counted_again() -> None:
    """The mirror's path skips a block whose counts did not change since it last told them; a record told
    in between (`observe`) is a change of its own."""
    tally = BlockTally([V4])
    tally.observe_counts("10.64.1.0/26", "a", {"a": 2})
    tally.observe("10.64.1.0/26", record("a", ["b"]))
    tally.observe_counts("10.64.1.0/26", "a", {"a": 2})
    assert tally.totals().in_use == {(V4.name, "a"): 2}
    tally.observe_counts("10.64.1.0/26", None, None)
    tally.observe_counts("10.64.1.0/26", "a", {"a": 2})
    assert tally.totals().in_use == {(V4.name, "a"): 2}


def test_ippools_being_deleted_or_unreadable_are_left_out() -> None:
    items = [
        {"metadata": {"name": "a"}, "spec": {"cidr": "10.0.0.0/16"}},
        {
            "metadata": {"name": "b", "deletionTimestamp": "2025-01-01T00:00:00Z"},
            "spec": {"cidr": "10.1.0.0/16"},
        },
        {"metadata": {"name": "c"}, "spec": {"cidr": "bogus"}},
        "not an object",
    ]
    pools = parse_ippools(items)
    assert [(p.name, p.size) for p in pools] == [("a", 65536)]


CIDRS = ["10.64.0.0/26", "10.64.8.0/26", "10.99.0.0/26", "fd00:10::/122"]
NODES = ["a", "b", "c", None]
POOLS = [V4, V6, INNER]
blocks = st.one_of(
    st.none(),
    st.builds(record, st.sampled_from(["a", "b", None]), st.lists(st.sampled_from(NODES), max_size=6)),
)
steps = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["block", "counts"]), st.sampled_from(CIDRS), blocks),
        st.tuples(st.just("pools"), st.sets(st.sampled_from(POOLS)), st.none()),
    ),
    max_size=30,
)


def from_scratch(state: dict[str, BlockRecord], pools: list[IPPool]) -> tuple[Counter[tuple[str, str]], ...]:
    in_use: Counter[tuple[str, str]] = Counter()
    borrowed: Counter[tuple[str, str]] = Counter()
    per_host: Counter[tuple[str, str]] = Counter()
    for cidr, rec in state.items():
        pool = pool_of_block(cidr, pools)
        per_host[(pool, rec.host or "no_affinity")] += 1
        for slot in rec.slots.values():
            node = slot.attrs.get("node")
            in_use[(pool, node or "unknown_node")] += 1
            if node and node != rec.host:
                borrowed[(pool, node)] += 1
    return in_use, borrowed, per_host


@settings(max_examples=200, deadline=None)
@given(steps)
def test_incremental_totals_equal_a_full_recompute(ops: list[tuple[str, object, object]]) -> None:
    """Whichever way a block is told (a record, or the mirror's counts, which skip a block whose counts
    did not change and keep each block's pool until the pools change)."""
    tally = BlockTally()
    state: dict[str, BlockRecord] = {}
    pools: list[IPPool] = []
    for op, arg, rec in ops:
        if op in ("block", "counts"):
            assert isinstance(arg, str)
            assert rec is None or isinstance(rec, BlockRecord)
            if op == "block":
                tally.observe(arg, rec)
            else:  # as the mirror tells it: the host and the allocations per `node` attribute
                counts = Counter(slot.attrs.get("node", "") for slot in rec.slots.values()) if rec else None
                tally.observe_counts(arg, rec.host if rec else None, counts)
            if rec is None:
                state.pop(arg, None)
            else:
                state[arg] = rec
        else:
            assert isinstance(arg, set)
            pools = sorted(arg)
            tally.set_pools(pools)
    t = tally.totals()
    in_use, borrowed, per_host = from_scratch(state, pools)
    assert (t.in_use, t.borrowed, t.blocks) == (dict(in_use), dict(borrowed), dict(per_host))
