"""The handle collector's scan kept small: every IPAMHandle of the cluster and what the blocks hold for
each, as the judgement (`shared.consistency.divergences`) reads them, in a fraction of the memory.

Why: the leader's scan keeps one IPAMHandle and one `Holding` per handle of the cluster until the blocks
are read (handles are listed first, `workers/leader/handle_scan.py`): ~880 bytes a handle as plain
objects, most of the leader's 143 MiB at 150,000 real-size pods (its imports hold 43; docs/benchmarks.md).
Nearly every handle is the usual one: its id its object name, not soft-deleted, one ordinal in one block,
and the blocks hold exactly that.  So:

- every name is kept under one key (`_key`): a pod's handle name (`k8s-pod-network.` and the 64 hex
  digits of a container id) as the 32 bytes those digits spell (65 bytes against a string's 129), any
  other name as itself, interned;
- a usual handle is kept as one integer: its resourceVersion (when decimal, as the API server writes it),
  the index of its CIDR in the table's list of CIDRs, and one bit, set when the blocks are found to hold
  exactly its one ordinal there (`HandleTable.absorb`): that holding is then kept by that bit alone, not
  as an entry of the holdings' table.  A usual handle whose resourceVersion is not decimal is kept as
  (resourceVersion, CIDR), and its holding in the holdings' table;
- a holding of one ordinal spelled as its name is kept as the block's CIDR (one string per block,
  interned); anything else, handle or holding, is kept whole.

Both tables are read-only `Mapping`s by name that give back the very `IPAMHandle` and `Holding` the plain
dicts would hold (tests/shared/test_handle_tables.py holds them equal), so the judgement is unchanged.
`unsettled` names what that judgement has to look at: a usual handle whose blocks hold exactly its one
ordinal agrees with them, and is left out without being rebuilt.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from typing import TypeVar, cast

from shared.consistency import Holding, held_handles
from shared.model import IPAMBlock, IPAMHandle

T = TypeVar("T")
Key = str | bytes

_POD_HANDLE = "k8s-pod-network."  # Calico's CNI plugin: `<network name>.<container id>`
_ID_DIGITS = 64


def _key(name: str) -> Key:
    """The key `name` is kept under (see the module docstring); `_name` gives the name back."""
    if len(name) == len(_POD_HANDLE) + _ID_DIGITS and name.startswith(_POD_HANDLE):
        digits = name[len(_POD_HANDLE) :]
        try:
            spelled = bytes.fromhex(digits)
        except ValueError:
            return sys.intern(name)
        if spelled.hex() == digits:  # lower-case hex only (fromhex also takes upper case and spaces)
            return spelled
    return sys.intern(name)


def _name(key: Key) -> str:
    return key if isinstance(key, str) else _POD_HANDLE + key.hex()


class _Compact(Mapping[str, T]):
    """A read-only mapping by object name whose values are kept compact and given back whole (`_whole`)."""

    __slots__ = ("_by_key",)

    def __init__(self) -> None:
        self._by_key: dict[Key, object] = {}

    def _whole(self, name: str, kept: object) -> T:
        raise NotImplementedError

    def clear(self) -> None:
        self._by_key.clear()

    def __getitem__(self, name: str) -> T:
        return self._whole(name, self._by_key[_key(name)])

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and _key(name) in self._by_key

    def __iter__(self) -> Iterator[str]:
        return map(_name, self._by_key)

    def __len__(self) -> int:
        return len(self._by_key)


# A usual handle's integer: ((resourceVersion × CIDR_SLOTS + CIDR index) << 1) | held, where `held` says
# the blocks hold exactly its one ordinal (`HandleTable.absorb`).
CIDR_SLOTS = 1 << 24
_HELD = 1


def _decimal(rv: str) -> bool:
    """`rv` is a decimal number written as `str(int(rv))` would write it (what etcd's revisions give)."""
    return rv.isascii() and rv.isdigit() and (rv == "0" or rv[0] != "0")


class HandleTable(_Compact[IPAMHandle]):
    """IPAMHandles by object name (`add`); the usual one kept as one integer (see the module docstring),
    or as (resourceVersion, CIDR) when its resourceVersion is not a plain decimal."""

    __slots__ = ("_cidr_index", "_cidrs", "absorbed")

    def __init__(self) -> None:
        super().__init__()
        self._cidrs: list[str] = []
        self._cidr_index: dict[str, int] = {}
        self.absorbed = 0  # usual handles whose one holding is kept by their bit

    def clear(self) -> None:
        super().clear()
        self._cidrs.clear()
        self._cidr_index.clear()
        self.absorbed = 0

    def add(self, handle: IPAMHandle) -> None:
        key = _key(handle.name)
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
                    self._by_key[key] = (int(rv) * CIDR_SLOTS + index) << 1
                else:
                    self._by_key[key] = (rv, cidr)
                return
        self._by_key[key] = handle

    def _cidr_of(self, kept: int) -> str:
        """The CIDR a usual handle's integer names."""
        return self._cidrs[(kept >> 1) % CIDR_SLOTS]

    def usual_cidr(self, kept: object) -> str | None:
        """The CIDR of a usual handle as kept (one ordinal there, not deleted, its id its name); None for
        any other."""
        if isinstance(kept, int):
            return self._cidr_of(kept)
        if isinstance(kept, tuple):
            return cast(tuple[str, str], kept)[1]
        return None

    # -- holdings kept by the handle's bit (`HoldingTable`) ------------------------------------------------

    def absorb(self, key: Key, cidr: str) -> bool:
        """The blocks' first holding of `key`, one ordinal in `cidr` spelled as its name: kept by the
        handle's bit when the handle is a usual one of that CIDR not holding one already."""
        kept = self._by_key.get(key)
        if isinstance(kept, int) and not kept & _HELD and self._cidr_of(kept) == cidr:
            self._by_key[key] = kept | _HELD
            self.absorbed += 1
            return True
        return False

    def held_cidr(self, key: Key) -> str | None:
        """The CIDR of the holding kept by `key`'s bit, None if none is."""
        kept = self._by_key.get(key)
        if isinstance(kept, int) and kept & _HELD:
            return self._cidr_of(kept)
        return None

    def unabsorb(self, key: Key) -> str | None:
        """Clear `key`'s bit (the blocks hold more for it: `HoldingTable` keeps it whole); its CIDR, or None
        if the bit was not set."""
        cidr = self.held_cidr(key)
        if cidr is not None:
            self._by_key[key] = cast(int, self._by_key[key]) & ~_HELD
            self.absorbed -= 1
        return cidr

    def held_keys(self) -> Iterator[Key]:
        return (k for k, kept in self._by_key.items() if isinstance(kept, int) and kept & _HELD)

    def unabsorb_all(self) -> None:
        for key in list(self.held_keys()):
            self.unabsorb(key)

    def _whole(self, name: str, kept: object) -> IPAMHandle:
        if isinstance(kept, IPAMHandle):
            return kept
        if isinstance(kept, int):
            rv, cidr = str((kept >> 1) // CIDR_SLOTS), self._cidr_of(kept)
        else:
            rv, cidr = cast(tuple[str, str], kept)
        return IPAMHandle(name=name, handle_id=name, block={cidr: 1}, resource_version=rv)


class HoldingTable(_Compact[Holding]):
    """What the blocks hold per IPAMHandle object name (`add_block`, as `shared.consistency.add_holdings`
    counts it); one ordinal in one block, spelled as the name, kept by the bit of the usual handle of
    `handles` it agrees with, else as that block's CIDR.  `handles`: the scan's handles, listed before any
    block (None: every holding kept here)."""

    __slots__ = ("_handles",)

    def __init__(self, handles: HandleTable | None = None) -> None:
        super().__init__()
        self._handles = handles

    def clear(self) -> None:
        super().clear()
        if self._handles is not None:
            self._handles.unabsorb_all()

    def add_block(self, block: IPAMBlock) -> None:
        cidr = sys.intern(block.cidr_str)
        table = self._by_key
        handles = self._handles
        for name, sane in held_handles(block):
            key = _key(name)
            kept = table.get(key)
            if kept is None and handles is not None:
                prior = handles.unabsorb(key)  # held once already, kept by the handle's bit
                if prior is not None:
                    kept = table[key] = Holding(name, counts={prior: 1})
            if kept is None:
                if name != sane:
                    table[key] = Holding(sane, counts={cidr: 1})
                elif handles is None or not handles.absorb(key, cidr):
                    table[key] = cidr
                continue
            if isinstance(kept, str):
                kept = table[key] = Holding(name, counts={kept: 1})
            holding = cast(Holding, kept)
            holding.spelled(sane)
            holding.counts[cidr] = holding.counts.get(cidr, 0) + 1

    def _whole(self, name: str, kept: object) -> Holding:
        if isinstance(kept, Holding):
            return kept
        return Holding(name, counts={cast(str, kept): 1})

    def __getitem__(self, name: str) -> Holding:
        key = _key(name)
        kept = self._by_key.get(key)
        if kept is not None:
            return self._whole(name, kept)
        cidr = self._handles.held_cidr(key) if self._handles is not None else None
        if cidr is None:
            raise KeyError(name)
        return Holding(name, counts={cidr: 1})

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        key = _key(name)
        return key in self._by_key or (self._handles is not None and self._handles.held_cidr(key) is not None)

    def __iter__(self) -> Iterator[str]:
        yield from map(_name, self._by_key)
        if self._handles is not None:
            yield from map(_name, self._handles.held_keys())

    def __len__(self) -> int:
        return len(self._by_key) + (self._handles.absorbed if self._handles is not None else 0)


def unsettled(handles: HandleTable, holdings: HoldingTable) -> list[str]:
    """The names `shared.consistency.divergences` has to judge: every name of either table but a usual
    handle's whose blocks hold exactly one ordinal for it, in its CIDR (`classify_handle` is None for such
    a pair: not deleted, both count `{cidr: 1}`).  At 150,000 handles nearly all pairs are settled this
    way, without rebuilding an `IPAMHandle` and a `Holding` for each or sorting every name."""
    held = holdings._by_key
    out: list[str] = []
    for key, kept in handles._by_key.items():
        if isinstance(kept, int) and kept & _HELD:
            continue  # its one holding agrees (`HandleTable.absorb`)
        cidr = handles.usual_cidr(kept)
        if cidr is None or held.get(key) != cidr:
            out.append(_name(key))
    out += [_name(key) for key in held if key not in handles._by_key]
    return out
