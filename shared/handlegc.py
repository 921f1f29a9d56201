"""When a divergent IPAMHandle may be repaired, and what the repair writes: the handle collector's rule.

Why it exists: the leader's handle collector (`workers/leader/handle_gc.py`) and `ipamgc check` must agree
on one rule, and the rule must be testable without an API server or a clock.  Which handles diverge, and
in which class, is `shared.consistency` (`handle_divergences`); this module adds time: the history of
observations, one per leader scan, and the decision that a disagreement has held long enough.

The rule (docs/handles.md): a handle is repaired only when the *same* disagreement — same class, same
resourceVersion of the IPAMHandle, same recorded counts, same counts held by the blocks — has been seen
in at least `passes` consecutive scans (Calico's PR #12713: 3) *and* for at least `grace` seconds since it
was first seen.  Any change of that evidence starts the count again.  The repair itself re-reads the
handle and its blocks live and goes ahead only if they still show that evidence (`confirm`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum

from shared.consistency import Divergence, HandleClass

# Calico's PR #12713 `requiredStableCycles`: consecutive scans showing the same disagreement.
REQUIRED_PASSES = 3


class Action(StrEnum):
    """What a repair writes to the IPAMHandle (never to a block)."""

    DELETE = "delete"  # an empty orphan, or a stuck soft-delete finished: DELETE with uid+rv preconditions
    EMPTY = "empty"  # an orphan that still records counts: counts emptied (PUT at rv); deleted later
    SET_COUNTS = "set-counts"  # a skewed handle: counts set to what the blocks hold (PUT at rv)
    CREATE = "create"  # a missing handle: created with what the blocks hold (POST; 409 if it exists)


def action_for(d: Divergence) -> Action:
    """The repair of a divergence.  A non-empty handle is never deleted in one step (PR #12713's rule):
    an orphan's counts are emptied first, and the empty handle is deleted only after it has held empty
    through a new observation window."""
    if d.cls is HandleClass.MISSING:
        return Action.CREATE
    if d.cls is HandleClass.SKEWED:
        return Action.SET_COUNTS
    if d.cls is HandleClass.ORPHAN and any(n > 0 for n in d.recorded.values()):
        return Action.EMPTY
    return Action.DELETE  # empty orphan, or stuck soft-delete (the library's own read would delete it)


def canonical(counts: Mapping[str, int]) -> str:
    return ",".join(f"{c}={n}" for c, n in sorted(counts.items()) if n > 0)


def signature(d: Divergence) -> str:
    """The evidence that must not change for the count of observations to go on."""
    return (
        f"{d.cls}|rv={d.resource_version}|deleted={d.deleted}|"
        f"recorded={canonical(d.recorded)}|held={canonical(d.held)}"
    )


@dataclass(frozen=True, slots=True)
class Observation:
    """One divergent handle's history: its evidence, when it was first seen with it, in how many
    consecutive scans, and whether a dry run has already reported it."""

    divergence: Divergence
    signature: str
    first_seen: float
    passes: int = 1
    reported: bool = False

    def due_at(self, grace: float, passes: int = REQUIRED_PASSES) -> float | None:
        """When the grace condition is met; None until enough scans have seen it (the passes condition
        is met only by scanning, not by time)."""
        if self.passes < passes:
            return None
        return self.first_seen + grace

    def due(self, now: float, grace: float, passes: int = REQUIRED_PASSES) -> bool:
        at = self.due_at(grace, passes)
        return at is not None and now >= at


def observe(
    history: Mapping[str, Observation], divergences: Iterable[Divergence], now: float
) -> dict[str, Observation]:
    """The history after one more scan at `now`: a divergence seen with the same evidence counts one more
    pass, a new or changed one starts at one, and a handle no longer divergent is forgotten."""
    out: dict[str, Observation] = {}
    for d in divergences:
        sig = signature(d)
        prev = history.get(d.name)
        if prev is not None and prev.signature == sig:
            out[d.name] = replace(prev, divergence=d, passes=prev.passes + 1)
        else:
            out[d.name] = Observation(divergence=d, signature=sig, first_seen=now)
    return out


def confirm(obs: Observation, live: Divergence | None) -> str | None:
    """Whether the live re-read (just before the write) still shows the observed evidence: None when it
    does, else why not (the repair is refused and the count starts again)."""
    if live is None:
        return "the handle agrees with the blocks now"
    if obs.divergence.ambiguous or live.ambiguous:
        return "the blocks spell this handle id in more than one case: left for a person"
    sig = signature(live)
    if sig != obs.signature:
        return f"changed since first seen: was [{obs.signature}], now [{sig}]"
    return None


def earliest_repair(grace: float, scan_interval: float, passes: int = REQUIRED_PASSES) -> float:
    """Seconds from a leader's first sight of a divergence to its earliest repair: the grace period, or
    the scans it takes to see it `passes` times, whichever is longer."""
    return max(grace, (passes - 1) * scan_interval)
