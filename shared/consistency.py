"""Do blocks, handles and affinities agree?  The invariants Calico's IPAM library keeps between them.

- every IPAMHandle's per-block count equals the number of ordinals that handle holds in that block
  (Windows-reserved ordinals aside: the library reserves them when it creates the block, with no
  IPAMHandle);
- every handle held in a block has an IPAMHandle (a missing one is tolerated by Calico, #3940, but is
  still worth reporting);
- every `host:` block has a BlockAffinity for that host and CIDR (in state `confirmed`), and every
  confirmed BlockAffinity points at a block affine to its node.

Used by the tests and by the chaos runs after each run (`ipamgc/chaos/`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from shared.model import WINDOWS_RESERVED_HANDLE, sanitize_handle
from shared.names import handle_name
from shared.snapshot import Inventory


@dataclass(frozen=True, slots=True)
class Problem:
    kind: str  # handle-count, handle-missing, handle-extra, affinity-missing, affinity-orphan, ...
    subject: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.subject}: {self.detail}"


def check_consistency(inv: Inventory) -> list[Problem]:
    problems: list[Problem] = []
    held: Counter[tuple[str, str]] = Counter()  # (handle object name, block cidr) → ordinals
    handle_ids: dict[str, str] = {}
    for cidr, block in inv.blocks.items():
        for index in block.allocations:
            if index is None:
                continue
            hid = block.attributes[index].handle_id
            if hid is None or hid.lower() == WINDOWS_RESERVED_HANDLE:
                continue
            name = handle_name(sanitize_handle(hid))
            held[(name, cidr)] += 1
            handle_ids[name] = hid
    recorded: Counter[tuple[str, str]] = Counter()
    for name, handle in inv.handles.items():
        if handle.deleted or name == WINDOWS_RESERVED_HANDLE:
            continue
        for cidr, count in handle.block.items():
            recorded[(name, cidr)] = count
    for key in sorted(set(held) | set(recorded)):
        name, cidr = key
        if name not in inv.handles:
            problems.append(
                Problem("handle-missing", handle_ids.get(name, name), f"holds {held[key]} in {cidr}")
            )
        elif held[key] != recorded[key]:
            problems.append(
                Problem("handle-count", name, f"{cidr}: handle says {recorded[key]}, block holds {held[key]}")
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
