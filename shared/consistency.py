"""Do blocks, handles and affinities agree?  The invariants Calico's IPAM library keeps between them.

- every IPAMHandle's per-block count equals the number of ordinals that handle holds in that block
  (Windows-reserved ordinals aside: the library reserves them when it creates the block, with no
  IPAMHandle);
- every handle held in a block has an IPAMHandle (a missing one is tolerated by Calico, #3940, but is
  still worth reporting);
- every `host:` block has a BlockAffinity for that host and CIDR (in state `confirmed`), and every
  confirmed BlockAffinity points at a block affine to its node.

The handle half is also the handle collector's judgement (docs/handles.md): `handle_holdings` counts what
the blocks hold per handle, `classify_handle` names how one IPAMHandle disagrees with that (orphan,
skewed, missing, stuck soft-deleted), and `handle_divergences` applies it to a whole view.  The leader
(`workers/leader/handle_gc.py`) decides with these, `ipamgc check` lists them, and `check_consistency`
(the tests, the chaos runs after each run) reports the count half of them as problems.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from shared.model import WINDOWS_RESERVED_HANDLE, IPAMBlock, IPAMHandle, sanitize_handle
from shared.names import handle_name
from shared.snapshot import Inventory


@dataclass(frozen=True, slots=True)
class Problem:
    kind: str  # handle-count, handle-missing, handle-extra, affinity-missing, affinity-orphan, ...
    subject: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.subject}: {self.detail}"


@dataclass(slots=True)
class Holding:
    """What the blocks hold for one IPAMHandle object name: the handle id spelled in the blocks (the least,
    when two ids differ only in case: `ambiguous`) and the ordinals held per block CIDR.  Kept small: the
    leader's scan keeps one per handle of the cluster."""

    handle_id: str = ""  # the handle id to write in a recreated IPAMHandle
    ambiguous: bool = False
    counts: dict[str, int] = field(default_factory=dict)

    def spelled(self, hid: str) -> None:
        if not self.handle_id:
            self.handle_id = hid
        elif hid != self.handle_id:
            self.ambiguous = True
            self.handle_id = min(self.handle_id, hid)


def held_handles(block: IPAMBlock) -> Iterator[tuple[str, str]]:
    """(IPAMHandle object name, sanitised handle id) of every ordinal `block` holds for a handle, one
    pair per ordinal (see `handle_holdings` for what is left out)."""
    attributes = block.attributes
    for index in block.allocations:
        if index is None or index >= len(attributes):
            continue
        hid = attributes[index].handle_id
        if hid is None or not hid or hid.lower() == WINDOWS_RESERVED_HANDLE:
            continue
        sane = sanitize_handle(hid)
        yield handle_name(sane), sane


def add_holdings(out: dict[str, Holding], block: IPAMBlock) -> None:
    """Count what `block` holds per IPAMHandle object name into `out` (see `handle_holdings`)."""
    cidr = block.cidr_str
    for name, sane in held_handles(block):
        holding = out.get(name)
        if holding is None:
            holding = out[name] = Holding(name if name == sane else sane)  # one string, not two
        else:
            holding.spelled(sane)
        holding.counts[cidr] = holding.counts.get(cidr, 0) + 1


def handle_holdings(blocks: Iterable[IPAMBlock]) -> dict[str, Holding]:
    """Per IPAMHandle object name (the lower-cased, sanitised handle id), what the blocks hold for it:
    every allocated ordinal whose attribute names a handle, Windows-reserved ordinals aside (no IPAMHandle
    is ever written for them) and cooldown ordinals aside (their attribute names no handle)."""
    out: dict[str, Holding] = {}
    for block in blocks:
        add_holdings(out, block)
    return out


class HandleClass(StrEnum):
    """How an IPAMHandle disagrees with the blocks (the four classes of Calico's PR #12713)."""

    ORPHAN = "orphan"  # exists, not soft-deleted, no block holds an ordinal for it
    SKEWED = "skewed"  # exists, held by some block, but its per-block counts are not what the blocks hold
    MISSING = "missing"  # some block holds an ordinal for it, and no IPAMHandle exists
    STUCK_DELETED = "stuck-deleted"  # soft-deleted (`spec.deleted: true`) and never deleted


def _positive(counts: Mapping[str, int]) -> dict[str, int]:
    return {cidr: n for cidr, n in counts.items() if n > 0}


def classify_handle(handle: IPAMHandle | None, held: Mapping[str, int]) -> HandleClass | None:
    """The class of one IPAMHandle (None: absent) against what the blocks hold for it; None when they
    agree.  A zero count is no entry (the library deletes an entry that reaches zero)."""
    held = _positive(held)
    if handle is None:
        return HandleClass.MISSING if held else None
    if handle.deleted:
        return HandleClass.STUCK_DELETED
    if not held:
        return HandleClass.ORPHAN
    if _positive(handle.block) != held:
        return HandleClass.SKEWED
    return None


@dataclass(frozen=True, slots=True)
class Divergence:
    """One IPAMHandle that disagrees with the blocks: its object name, class, what it records (empty when
    missing) and what the blocks hold."""

    name: str
    handle_id: str
    cls: HandleClass
    recorded: Mapping[str, int]
    held: Mapping[str, int]
    deleted: bool = False
    resource_version: str = ""
    ambiguous: bool = False  # the blocks spell its handle id in more than one case

    def describe(self) -> str:
        def text(counts: Mapping[str, int]) -> str:
            return ", ".join(f"{c}={n}" for c, n in sorted(counts.items())) or "nothing"

        deleted = " (soft-deleted)" if self.deleted else ""
        return f"handle{deleted} records {text(self.recorded)}; blocks hold {text(self.held)}"


def divergence_of(name: str, handle: IPAMHandle | None, holding: Holding | None) -> Divergence | None:
    """How the IPAMHandle named `name` (None: absent) disagrees with what the blocks hold for it
    (`holding`, None: nothing); None when they agree."""
    held = holding.counts if holding is not None else {}
    cls = classify_handle(handle, held)
    if cls is None:
        return None
    spelled = holding.handle_id if holding is not None else name
    handle_id = handle.handle_id if handle is not None else spelled
    return Divergence(
        name=name,
        handle_id=handle_id,
        cls=cls,
        recorded=dict(handle.block) if handle is not None else {},
        held=dict(held),
        deleted=handle.deleted if handle is not None else False,
        resource_version=handle.resource_version if handle is not None else "",
        ambiguous=holding is not None and holding.ambiguous,
    )


def handle_divergences(
    blocks: Iterable[IPAMBlock], handles: Mapping[str, IPAMHandle], unreadable: Iterable[str] = ()
) -> list[Divergence]:
    """Every IPAMHandle (by object name) that disagrees with the blocks, by name.  The Windows-reserved
    handle is never judged, nor a handle whose object exists but could not be read (`unreadable`)."""
    return divergences(handle_holdings(blocks), handles, unreadable)


def divergences(
    holdings: Mapping[str, Holding],
    handles: Mapping[str, IPAMHandle],
    unreadable: Iterable[str] = (),
    names: Iterable[str] | None = None,
) -> list[Divergence]:
    """`handle_divergences` from holdings already counted (the leader's scan counts each block as its
    page comes and keeps no block).  `names`: the only names that can disagree (the others known to
    agree, `shared.handletables.unsettled`); None: every name of either mapping."""
    skip = {WINDOWS_RESERVED_HANDLE, *unreadable}
    out: list[Divergence] = []
    for name in sorted(set(names) if names is not None else set(holdings) | set(handles)):
        if name in skip:
            continue
        d = divergence_of(name, handles.get(name), holdings.get(name))
        if d is not None:
            out.append(d)
    return out


def check_consistency(inv: Inventory) -> list[Problem]:
    problems: list[Problem] = []
    holdings = handle_holdings(inv.blocks.values())
    held = {(name, cidr): n for name, h in holdings.items() for cidr, n in h.counts.items()}
    recorded: dict[tuple[str, str], int] = {}
    for name, handle in inv.handles.items():
        if handle.deleted or name == WINDOWS_RESERVED_HANDLE:
            continue
        for cidr, count in handle.block.items():
            recorded[(name, cidr)] = count
    for key in sorted(set(held) | set(recorded)):
        name, cidr = key
        if name not in inv.handles:
            subject = holdings[name].handle_id if name in holdings else name
            problems.append(Problem("handle-missing", subject, f"holds {held.get(key, 0)} in {cidr}"))
        elif held.get(key, 0) != recorded.get(key, 0):
            problems.append(
                Problem(
                    "handle-count",
                    name,
                    f"{cidr}: handle says {recorded.get(key, 0)}, block holds {held.get(key, 0)}",
                )
            )
    affine = {(b.host, cidr) for cidr, b in inv.blocks.items() if b.host is not None}
    confirmed = {
        (a.node, str(a.cidr)) for a in inv.affinities.values() if a.state == "confirmed" and not a.deleted
    }
    for node, cidr in sorted(affine - confirmed, key=str):
        problems.append(Problem("affinity-missing", f"{node} {cidr}", "block is affine but has no affinity"))
    for node, cidr in sorted(confirmed - affine, key=str):
        problems.append(Problem("affinity-orphan", f"{node} {cidr}", "affinity without a block affine to it"))
    return problems
