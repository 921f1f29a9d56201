"""One comparison: a cluster loaded twice, collected once by Calico's kube-controllers and once by ipamgc
(never both on one cluster), the two outcomes diffed against the cluster's ground truth.

Why a module of its own: the order and the isolation of the two runs are the experiment; the command
line (`lab/commands/compare.py`) only chooses the clusters and prints.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.compare.collectors import deadline_for, quiet_window, run_calico, run_ipamgc
from lab.compare.diff import UNDECLARED, Difference, diff
from lab.compare.facts import facts_of
from lab.compare.recorder import Outcome
from lab.compare.sandbox import sandbox

__all__ = ["ClusterResult", "compare_cluster", "slack_for"]


def slack_for(grace: float) -> float:
    """Two releases of one thing differ when more than this apart: a grace period plus Calico's full-scan
    period (grace / 2) plus a margin for a shared machine."""
    return quiet_window(grace)


@dataclass
class ClusterResult:
    name: str
    allocations: int
    blocks: int
    affinities: int
    calico: Outcome
    ipamgc: Outcome
    differences: list[Difference] = field(default_factory=list)
    features: tuple[str, ...] = ()

    @property
    def undeclared(self) -> int:
        return sum(1 for d in self.differences if d.cls == UNDECLARED)

    @property
    def complete(self) -> bool:
        """Both runs ended quiet, without error."""
        return all(o.quiet and not o.error for o in (self.calico, self.ipamgc))

    def as_dict(self) -> dict[str, Any]:
        return {
            "cluster": self.name,
            "features": list(self.features),
            "allocations": self.allocations,
            "blocks": self.blocks,
            "affinities": self.affinities,
            "runs": {"calico": self.calico.as_dict(), "ipamgc": self.ipamgc.as_dict()},
            "differences": [d.as_dict() for d in self.differences],
        }


def compare_cluster(
    name: str,
    items: list[Any],
    binary: Path,
    grace: float,
    grace_text: str,
    *,
    features: tuple[str, ...] = (),
    progress: Callable[[str], None] = lambda _: None,
    deadline: float | None = None,
) -> ClusterResult:
    """Collect `items` with each collector on its own fresh cluster; diff the outcomes."""
    facts = facts_of(items)
    limit = deadline_for(grace) if deadline is None else deadline
    with tempfile.TemporaryDirectory(prefix="ipamgc-compare-") as tmp:
        work = Path(tmp)
        progress(f"{name}: Calico's kube-controllers")
        with sandbox(items, grace_text, work, "calico") as sb:
            calico = run_calico(sb, binary, work, grace, limit)
        progress(f"{name}: ipamgc")
        with sandbox(items, grace_text, work, "ipamgc") as sb:
            ipamgc = run_ipamgc(sb, work, grace, limit)
    differences = diff(facts, calico, ipamgc, slack_for(grace))
    return ClusterResult(
        name,
        len(facts.allocations),
        len(facts.blocks),
        len(facts.affinities),
        calico,
        ipamgc,
        differences,
        features,
    )
