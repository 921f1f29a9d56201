"""The handle collector's scan kept small: every IPAMHandle of the cluster and what the blocks hold for
each, as the judgement (`shared.consistency.divergences`) reads them, in under half the memory.

Why: the leader's scan keeps one IPAMHandle and one `Holding` per handle of the cluster until the blocks
are read (handles are listed first, `workers/leader/handle_scan.py`): ~880 bytes a handle, most of the
leader's 143 MiB at 150,000 real-size pods (its imports hold 43; docs/benchmarks.md).  Nearly every
handle is the usual one: its id its object name, not soft-deleted, one ordinal in one block, and the
blocks hold exactly that.
Such a handle is kept here as (resourceVersion, CIDR) and its holding as the CIDR alone (one string per
block CIDR, interned), both under one interned name string; anything else is kept whole.  Both tables
are read-only `Mapping`s that give back the very `IPAMHandle` and `Holding` the plain dicts would hold
(tests/shared/test_handle_tables.py holds them equal), so the judgement is unchanged.
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


class HandleTable(_Compact[IPAMHandle]):
    """IPAMHandles by object name (`add`); the usual one kept as (resourceVersion, CIDR)."""

    __slots__ = ()

    def add(self, handle: IPAMHandle) -> None:
        name = sys.intern(handle.name)  # the holdings' key is this very string
        if handle.handle_id == handle.name and not handle.deleted and len(handle.block) == 1:
            ((cidr, count),) = handle.block.items()
            if count == 1:
                self._by_name[name] = (handle.resource_version, sys.intern(cidr))
                return
        self._by_name[name] = handle

    def _whole(self, name: str, kept: object) -> IPAMHandle:
        if isinstance(kept, IPAMHandle):
            return kept
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
