"""A relist of one mirrored kind: the whole set replaced by a fresh list, fed page by page.

Why a module: a relist (the first list of a kind, or one after a 410 Gone) is a session with state of its
own, the names seen so far, and it must emit the deletes a missed watch would have: whatever is mirrored
but was not listed is deleted and dirtied when the list ends (`finish`), except what the reflector could
not parse (`keep`: kept as it is, since it may hold IPs).  Pages are applied as they arrive, so a cold
start holds one page of typed objects at a time, never the whole cluster.  It goes through the mirror's
ordinary apply paths (`producer/mirror.py`), whose narrow interface it declares here rather than import
the module that imports it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Protocol

from producer.memory import Memory
from shared.blockrecords import MirroredBlock
from shared.keys import pod_key
from shared.model import IPAMBlock, Node, Pod


class Kind(StrEnum):
    """The kinds the mirror keeps and relists."""

    BLOCKS = "blocks"
    PODS = "pods"
    NODES = "nodes"


class RelistedMirror(Protocol):
    """`producer.mirror.Mirror` as a relist uses it: its memory and its apply paths."""

    def _memory(self) -> Memory: ...

    def _blocks(self, latest: Mapping[str, IPAMBlock | MirroredBlock | None]) -> int: ...

    def apply_blocks(self, blocks: Iterable[IPAMBlock | MirroredBlock]) -> int: ...

    def apply_pods(self, pods: Iterable[Pod]) -> int: ...

    def apply_nodes(self, nodes: Iterable[Node]) -> int: ...

    def delete_pods(self, names: Iterable[tuple[str, str]]) -> int: ...

    def delete_nodes(self, names: Iterable[str]) -> int: ...


class Relist:
    """One relist of one kind in progress (see `Mirror.begin_relist`)."""

    def __init__(self, mirror: RelistedMirror, kind: Kind) -> None:
        self.mirror = mirror
        self.kind = kind
        self.seen: set[str] = set()

    def page(self, objects: Iterable[object]) -> int:
        """Mirror one page of the list (upserts; what a page lists as deleted is deleted)."""
        m, kind = self.mirror, self.kind
        fresh = list(objects)
        want = {Kind.BLOCKS: (IPAMBlock, MirroredBlock), Kind.PODS: (Pod,), Kind.NODES: (Node,)}[kind]
        for obj in fresh:
            if not isinstance(obj, want):
                raise TypeError(f"relist {kind}: {type(obj).__name__} is not {want[0].__name__}")
        if kind is Kind.BLOCKS:
            blocks = [o for o in fresh if isinstance(o, (IPAMBlock, MirroredBlock))]
            self.seen.update(b.cidr_str for b in blocks if not b.deleted)
            return m.apply_blocks(blocks)
        if kind is Kind.PODS:
            pods = [o for o in fresh if isinstance(o, Pod)]
            self.seen.update(pod_key(p.namespace, p.name) for p in pods)
            return m.apply_pods(pods)
        nodes = [o for o in fresh if isinstance(o, Node)]
        self.seen.update(n.name for n in nodes)
        return m.apply_nodes(nodes)

    def finish(self, keep: Iterable[str] | None = ()) -> int:
        """Delete (and dirty) what is mirrored but was not listed, except `keep`; None: delete nothing."""
        if keep is None:
            return 0
        m, kind = self.mirror, self.kind
        mem = m._memory()
        mirrored: set[str] = set(
            mem.blocks if kind is Kind.BLOCKS else mem.pods if kind is Kind.PODS else mem.nodes
        )
        gone = sorted(mirrored - self.seen - set(keep))
        if kind is Kind.BLOCKS:
            return m._blocks(dict.fromkeys(gone))
        if kind is Kind.PODS:
            return m.delete_pods((ns, n) for ns, _, n in (name.partition("/") for name in gone))
        return m.delete_nodes(gone)
