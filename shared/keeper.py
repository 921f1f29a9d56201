"""Which empty block a node keeps, decided once, so that `ipamgc check` and the leader agree.

Calico's `releaseUnusedBlocks` never releases a node's last affine block: it counts the node's affine
blocks (`blocksByNode`, IPv4 and IPv6 together), releases an empty one only while that count is above 1,
and drops the count with every release (`forgetBlock`).  When every block of a node is empty, which one
survives depends on Go's random map order and on which grace period ends first.  ipamgc chooses instead:
the node keeps its lowest-addressed empty block (IPv4 before IPv6, then by address).  The leader looks at
a node's empty blocks with the keeper last, and judges the keeper as if the node's other empty blocks
that are still there were not counted (`keeper_count`): with a block in use left on the node the keeper
goes like any other; with none, it is the node's last block.  Pure: CIDR strings in, CIDR strings out.
"""

from __future__ import annotations

from collections.abc import Iterable

from shared.netaddr import AddressError, parse_network


def network_order(cidr: str) -> tuple[int, int, int, str]:
    """Sort key: IP version, network address, prefix length (an unparsable CIDR sorts last, by text)."""
    try:
        net = parse_network(cidr)
    except AddressError:
        return (99, 0, 0, cidr)
    return (net.version, int(net.network_address), net.prefixlen, cidr)


def release_order(empty: Iterable[str]) -> list[str]:
    """A node's empty blocks in the order the leader looks at them: the keeper (the lowest) last."""
    ordered = sorted(set(empty), key=network_order)
    return ordered[1:] + ordered[:1]


def keeper_of(empty: Iterable[str]) -> str | None:
    """The empty block the node keeps when all its blocks are empty (None: no empty block)."""
    ordered = sorted(set(empty), key=network_order)
    return ordered[0] if ordered else None


def keeper_count(affine_blocks: int, others_left: int) -> int:
    """The affine-block count the keeper is judged with: the node's count less its other empty blocks
    still there.  1 (its last block) unless a block that is not empty remains on the node."""
    return affine_blocks - others_left
