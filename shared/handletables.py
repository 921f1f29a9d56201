"""The handle collector's scan kept small: every IPAMHandle of the cluster and what the blocks hold for
each, as the judgement (`shared.consistency.divergences`) reads them, in under half the memory.

Why: the leader's scan keeps one IPAMHandle and one `Holding` per handle of the cluster until the blocks
are read (handles are listed first, `workers/leader/handle_scan.py`): ~880 bytes a handle, most of the
leader's 143 MiB at 150,000 real-size pods (its imports hold 43; docs/benchmarks.md).  Nearly every
handle is the usual one: its id its object name, not soft-deleted, one ordinal in one block, and the
blocks hold exactly that.
Such a handle is kept here as one integer (its resourceVersion, when decimal as the API server writes
it, and the index of its CIDR in the table's list of CIDRs; else as (resourceVersion, CIDR)) and its
holding as the CIDR alone (one string per block CIDR, interned), both under one interned name string;
anything else is kept whole.  Both tables are read-only `Mapping`s that give back the very `IPAMHandle`
and `Holding` the plain dicts would hold (tests/shared/test_handle_tables.py holds them equal), so the
judgement is unchanged.  `unsettled` names what that judgement has to look at: a usual handle whose
blocks hold exactly its one ordinal agrees with them, and is left out without being rebuilt.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from typing import TypeVar, cast

from shared.consistency import Holding, held_handles
from shared.model import IPAMBlock, IPAMHandle

T = TypeVar("T")


class _Compact(Mapping[str, T]):
    """A read-only mapping by object name whose values are kept compact and given back whole (`_whole`)."""

    __slots__ = ("_by_name",)

    def __init__(self) -> None:
        self._by_name: dict[str, object] = {}

    def _whole(self, name: str, kept: object) -> T:
        raise NotImplementedError

    def clear(self) -> None:
        self._by_name.clear()

    def __getitem__(self, name: str) -> T:
        return self._whole(name, self._by_name[name])

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)


# A usual handle's integer: resourceVersion × CIDR_SLOTS + the index of its CIDR (`HandleTable._cidrs`).
CIDR_SLOTS = 1 << 24


def _decimal(rv: str) -> bool:
    """`rv` is a decimal number written as `str(int(rv))` would write it (what etcd's revisions give)."""
    return rv.isascii() and rv.isdigit() and (rv == "0" or rv[0] != "0")


class HandleTable(_Compact[IPAMHandle]):
    """IPAMHandles by object name (`add`); the usual one kept as one integer (see the module docstring),
    or as (resourceVersion, CIDR) when its resourceVersion is not a plain decimal."""

    __slots__ = ("_cidr_index", "_cidrs")

    def __init__(self) -> None:
        super().__init__()
        self._cidrs: list[str] = []
        self._cidr_index: dict[str, int] = {}

    def clear(self) -> None:
        super().clear()
        self._cidrs.clear()
        self._cidr_index.clear()

    def add(self, handle: IPAMHandle) -> None:
        name = sys.intern(handle.name)  # the holdings' key is this very string
        if handle.handle_id == handle.name and not handle.deleted and len(handle.block) == 1:
            ((cidr, count),) = handle.block.items()
            if count == 1:
                cidr = sys.intern(cidr)
                rv = handle.resource_version
                index = self._cidr_index.get(cidr)
                if index is None and len(self._cidrs) < CIDR_SLOTS:
                    index = self._cidr_index[cidr] = len(self._cidrs)
                    self._cidrs.append(cidr)
                if index is not None and _decimal(rv):
                    self._by_name[name] = int(rv) * CIDR_SLOTS + index
                else:
                    self._by_name[name] = (rv, cidr)
                return
        self._by_name[name] = handle

    def usual_cidr(self, kept: object) -> str | None:
        """The CIDR of a usual handle as kept (one ordinal there, not deleted, its id its name); None for
        any other."""
        if isinstance(kept, int):
            return self._cidrs[kept % CIDR_SLOTS]
        if isinstance(kept, tuple):
            return cast(tuple[str, str], kept)[1]
        return None

    def _whole(self, name: str, kept: object) -> IPAMHandle:
        if isinstance(kept, IPAMHandle):
            return kept
        if isinstance(kept, int):
            rv, cidr = str(kept // CIDR_SLOTS), self._cidrs[kept % CIDR_SLOTS]
        else:
            rv, cidr = cast(tuple[str, str], kept)
        return IPAMHandle(name=name, handle_id=name, block={cidr: 1}, resource_version=rv)


class HoldingTable(_Compact[Holding]):
    """What the blocks hold per IPAMHandle object name (`add_block`, as `shared.consistency.add_holdings`
    counts it); one ordinal in one block, spelled as the name, kept as that block's CIDR."""

    __slots__ = ()

    def add_block(self, block: IPAMBlock) -> None:
        cidr = sys.intern(block.cidr_str)
        table = self._by_name
        for name, sane in held_handles(block):
            kept = table.get(name)
            if kept is None:
                if name == sane:
                    table[sys.intern(name)] = cidr
                else:
                    table[sys.intern(name)] = Holding(sane, counts={cidr: 1})
                continue
            if isinstance(kept, str):
                kept = table[name] = Holding(name, counts={kept: 1})
            holding = cast(Holding, kept)
            holding.spelled(sane)
            holding.counts[cidr] = holding.counts.get(cidr, 0) + 1

    def _whole(self, name: str, kept: object) -> Holding:
        if isinstance(kept, Holding):
            return kept
        return Holding(name, counts={cast(str, kept): 1})


def unsettled(handles: HandleTable, holdings: HoldingTable) -> list[str]:
    """The names `shared.consistency.divergences` has to judge: every name of either table but a usual
    handle's whose blocks hold exactly one ordinal for it, in its CIDR (`classify_handle` is None for such
    a pair: not deleted, both count `{cidr: 1}`).  At 150,000 handles nearly all pairs are settled this
    way, without rebuilding an `IPAMHandle` and a `Holding` for each or sorting every name."""
    held = holdings._by_name
    out = [
        name
        for name, kept in handles._by_name.items()
        if (cidr := handles.usual_cidr(kept)) is None or held.get(name) != cidr
    ]
    out += [name for name in held if name not in handles._by_name]
    return out
