"""Two collectors' outcomes side by side: every allocation, block and affinity they treated differently,
each classified as a declared divergence or not.

Why a module of its own: this is the verdict of `ipamgc compare`, and it must be checkable by hand.  A
difference is an outcome that differs (one side released or deleted it, the other kept it), or a release
both made more than `slack` seconds apart (each measured from the moment its collector had synced).  A
class is a predicate over the cluster as loaded (`ClusterFacts`) and both outcomes; the first that holds
names the difference, else it is `undeclared`.  The classes are the README's deliberate divergences and
the known items of issue 35 (eight places where ipamgc differs from Calico 3.33); nothing else.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from lab.compare.facts import AllocationFact, ClusterFacts
from lab.compare.recorder import Outcome

__all__ = ["CLASSES", "UNDECLARED", "Class", "Difference", "diff", "summary"]

UNDECLARED = "undeclared"


@dataclass(frozen=True, slots=True)
class Difference:
    kind: str  # allocation, block, affinity
    subject: str  # the IP, the block CIDR, the affinity name
    detail: str  # block, ordinal and handle of an allocation; the node of a block or affinity
    calico: float | None  # seconds after its collector synced, None: kept
    ipamgc: float | None
    truth: str
    what: str  # calico-only, ipamgc-only, calico-later, ipamgc-later
    cls: str = UNDECLARED

    @property
    def status(self) -> str:
        return CLASSES[self.cls].status if self.cls in CLASSES else UNDECLARED

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "subject": self.subject,
            "detail": self.detail,
            "calico_seconds": None if self.calico is None else round(self.calico, 2),
            "ipamgc_seconds": None if self.ipamgc is None else round(self.ipamgc, 2),
            "truth": self.truth,
            "difference": self.what,
            "class": self.cls,
            "status": self.status,
        }


@dataclass(frozen=True, slots=True)
class Context:
    facts: ClusterFacts
    calico: Outcome
    ipamgc: Outcome


Predicate = Callable[[Difference, Context], bool]


@dataclass(frozen=True, slots=True)
class Class:
    name: str
    status: str  # deliberate (the README lists it), issue-35 (a known item being followed up)
    where: str  # what the README or the issue says
    test: Predicate


# -- the predicates ------------------------------------------------------------------------------------


def _alloc(d: Difference, ctx: Context) -> AllocationFact | None:
    if d.kind != "allocation":
        return None
    for fact in ctx.facts.allocations.values():
        if fact.ip == d.subject and d.detail.startswith(fact.block):
            return fact
    return None


def _calico_released_only(d: Difference) -> bool:
    return d.what in ("calico-only", "ipamgc-later")


def _ipamgc_released_only(d: Difference) -> bool:
    return d.what in ("ipamgc-only", "calico-later")


def _stale_node(d: Difference, ctx: Context) -> bool:
    fact = _alloc(d, ctx)
    return fact is not None and _calico_released_only(d) and fact.detail == "pod-on-other-node"


def _unparsable_other_node(d: Difference, ctx: Context) -> bool:
    fact = _alloc(d, ctx)
    if fact is None or not _calico_released_only(d) or fact.detail != "pod-ip-unparsable":
        return False
    pod = ctx.facts.pods.get((fact.attrs.get("namespace", ""), fact.attrs.get("pod", ""))) or {}
    return str((pod.get("spec") or {}).get("nodeName") or "") != fact.node


def _whole_handle(d: Difference, ctx: Context) -> bool:
    """Calico released a leaked IP whose handle also holds an IP in use; ipamgc refuses the handle."""
    fact = _alloc(d, ctx)
    if fact is None or not _calico_released_only(d) or fact.truth != "leaked":
        return False
    return any(o.key != fact.key and o.truth == "in-use" for o in ctx.facts.by_handle(fact.handle))


def _blanked_annotation(d: Difference, ctx: Context) -> bool:
    fact = _alloc(d, ctx)
    return fact is not None and _ipamgc_released_only(d) and fact.detail == "pod-terminating-cni-del-done"


def _finished_unparsable(d: Difference, ctx: Context) -> bool:
    fact = _alloc(d, ctx)
    return fact is not None and _ipamgc_released_only(d) and fact.detail == "pod-finished-ip-unparsable"


def _block_of(d: Difference, ctx: Context) -> str | None:
    if d.kind == "block":
        return d.subject
    if d.kind == "affinity":
        aff = ctx.facts.affinities.get(d.subject)
        return aff.cidr if aff is not None else None
    return None


def _lowest_kept(d: Difference, ctx: Context) -> bool:
    """Both sides kept as many of the node's blocks, ipamgc the lowest-addressed ones (IPv4 first)."""
    cidr = _block_of(d, ctx)
    block = ctx.facts.blocks.get(cidr or "")
    if block is None or not block.node:
        return False
    ordered = [b.cidr for b in ctx.facts.node_blocks(block.node)]
    kept_c = [c for c in ordered if c not in ctx.calico.blocks_deleted]
    kept_i = [c for c in ordered if c not in ctx.ipamgc.blocks_deleted]
    if len(kept_c) != len(kept_i) or kept_c == kept_i or not kept_i:
        return False
    either = [c for c in ordered if c in kept_c or c in kept_i]
    return kept_i == either[: len(kept_i)]


def _inconsistent_affinity(d: Difference, ctx: Context) -> bool:
    """Calico's `ensureConsistentAffinity`: an empty block whose pool no longer selects its node loses its
    affinity (and the block) in Calico only."""
    cidr = _block_of(d, ctx)
    block = ctx.facts.blocks.get(cidr or "")
    return block is not None and _calico_released_only(d) and not block.in_pool


def _cooldown_node_blocks(d: Difference, ctx: Context) -> bool:
    """A block (or its affinity) that held cooling ordinals: Calico counts aged ones as free when it
    releases a node's blocks, ipamgc waits for its cold-IP pass to rewrite the block first."""
    cidr = _block_of(d, ctx)
    block = ctx.facts.blocks.get(cidr or "")
    return block is not None and _calico_released_only(d) and block.cooling > 0


CLASSES: dict[str, Class] = {
    c.name: c
    for c in (
        Class(
            "stale-node-fix",
            "deliberate",
            "README reason `stale-node-attribute`: a pod that reports the IP on another node keeps it "
            "(Calico #12257, fix PR #13538)",
            _stale_node,
        ),
        Class(
            "unparsable-ip-other-node",
            "deliberate",
            "README reason `pod-ip-unparsable`: a pod on another node whose IPs do not parse is kept",
            _unparsable_other_node,
        ),
        Class(
            "whole-handle-refusal",
            "deliberate",
            "README/issue 35: a handle with any valid member is refused whole (Calico releases a sibling)",
            _whole_handle,
        ),
        Class(
            "lowest-empty-block-kept",
            "deliberate",
            "README reason `last-block`: the node keeps its lowest-addressed empty block (Calico: Go map "
            "order)",
            _lowest_kept,
        ),
        Class(
            "ensure-consistent-affinity",
            "deliberate",
            "README (library meeting point) and issue 35 item 6: no `ensureConsistentAffinity`",
            _inconsistent_affinity,
        ),
        Class(
            "blanked-cni-annotation",
            "deliberate",
            "README (terminating pod, CNI annotation blanked: released) and issue 35 item 3 (follow Calico)",
            _blanked_annotation,
        ),
        Class(
            "finished-pod-unparsable-ip",
            "issue-35",
            "issue 35 item 4: a finished pod's IPs are parsed before its phase is looked at",
            _finished_unparsable,
        ),
        Class(
            "cooldown-node-blocks",
            "issue-35",
            "issue 35 item 5: aged cooldown ordinals count as free when a node's blocks are released",
            _cooldown_node_blocks,
        ),
    )
}


def classify(d: Difference, ctx: Context) -> str:
    for cls in CLASSES.values():
        if cls.test(d, ctx):
            return cls.name
    return UNDECLARED


# -- the diff ------------------------------------------------------------------------------------------


def _since_ready(at: float | None, outcome: Outcome) -> float | None:
    if at is None:
        return None
    return at - (outcome.ready or 0.0)


def _what(c: float | None, i: float | None, slack: float) -> str | None:
    if c is None and i is None:
        return None
    if i is None:
        return "calico-only"
    if c is None:
        return "ipamgc-only"
    if i - c > slack:
        return "ipamgc-later"
    if c - i > slack:
        return "calico-later"
    return None


def diff(facts: ClusterFacts, calico: Outcome, ipamgc: Outcome, slack: float) -> list[Difference]:
    """Every allocation, block and affinity whose outcome differs, classified.  `slack`: the timing
    difference (seconds) beyond which two releases of one thing differ (one grace period plus Calico's
    full-scan period, grace / 2, plus a margin for the machine)."""
    ctx = Context(facts, calico, ipamgc)
    out: list[Difference] = []

    def add(kind: str, subject: str, detail: str, c: float | None, i: float | None, truth: str) -> None:
        c, i = _since_ready(c, calico), _since_ready(i, ipamgc)
        what = _what(c, i, slack)
        if what is not None:
            d = Difference(kind, subject, detail, c, i, truth, what)
            out.append(Difference(kind, subject, detail, c, i, truth, what, classify(d, ctx)))

    keys = set(facts.allocations) | set(calico.released) | set(ipamgc.released)
    for key in sorted(keys, key=lambda k: (k[0], k[1], k[2])):
        fact = facts.allocations.get(key)
        truth = f"{fact.truth} ({fact.detail})" if fact is not None else "not in the input"
        cidr, ordinal, handle, ip = key
        detail = f"{cidr} #{ordinal} {handle or '(cooling)'}"
        add("allocation", ip, detail, calico.released.get(key), ipamgc.released.get(key), truth)
    for cidr in sorted(set(facts.blocks) | set(calico.blocks_deleted) | set(ipamgc.blocks_deleted)):
        block = facts.blocks.get(cidr)
        truth = block.truth if block is not None else "not in the input"
        node = block.node if block is not None else ""
        add("block", cidr, node, calico.blocks_deleted.get(cidr), ipamgc.blocks_deleted.get(cidr), truth)
    names = set(facts.affinities) | set(calico.affinities_deleted) | set(ipamgc.affinities_deleted)
    for name in sorted(names):
        aff = facts.affinities.get(name)
        truth = aff.truth if aff is not None else "not in the input"
        node = aff.node if aff is not None else ""
        c, i = calico.affinities_deleted.get(name), ipamgc.affinities_deleted.get(name)
        add("affinity", name, node, c, i, truth)
    return out


def summary(differences: Iterable[Difference]) -> dict[str, int]:
    """Differences counted per class."""
    return dict(sorted(Counter(d.cls for d in differences).items()))
