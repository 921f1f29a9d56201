"""What a chaos run found (`ChaosReport`: the judgement's figures and problems) and the stale leaders it
made (`StaleLeader`), shared by the runner and the judge.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ChaosReport:
    seed: int
    options: dict[str, Any]
    log_dir: str
    timeline: list[str] = field(default_factory=list)
    faults: dict[str, int] = field(default_factory=dict)
    leaks_injected: int = 0
    leaks_released: int = 0
    leaks_outstanding: list[str] = field(default_factory=list)
    max_latency: float = 0.0  # leak → release, seconds (includes the grace period)
    max_after_heal: float = 0.0  # seconds from the heal to the last release
    violations: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    inconsistencies: list[str] = field(default_factory=list)
    tolerated: list[str] = field(default_factory=list)  # see `judge_consistency`
    stale_writes: list[str] = field(default_factory=list)
    # Node churn (`lab.chaos.nodes`): the Node objects deleted, how many held nothing by the judgement,
    # the longest time from a node's due time (its deletion; an abrupt one's pod GC) to its last IP, block
    # and affinity freed, and a line per node still holding anything within grace + settle of the heal.
    nodes_deleted: int = 0
    nodes_freed: int = 0
    node_max_latency: float = 0.0
    node_part_latency: dict[str, float] = field(default_factory=dict)  # the same, for IPs, blocks, affinities
    nodes_not_freed: list[str] = field(default_factory=list)
    restarts: dict[str, int] = field(default_factory=dict)
    elapsed: float = 0.0
    # The soak (`lab.chaos.soak`): a dict per window (`SoakWindow`) and the slopes' verdict.
    soak_windows: list[dict[str, Any]] = field(default_factory=list)
    soak_verdict: dict[str, Any] = field(default_factory=dict)

    def problems(self) -> list[str]:
        out = [f"violation: {v}" for v in self.violations]
        out += [f"unexpected free: {u}" for u in self.unexpected]
        out += [f"leak not released within grace + settle: {ip}" for ip in self.leaks_outstanding]
        out += [f"inconsistent: {p}" for p in self.inconsistencies]
        out += [f"stale leader wrote: {w}" for w in self.stale_writes]
        out += [
            f"deleted node not freed within grace + settle of the heal: {n}" for n in self.nodes_not_freed
        ]
        out += [f"grew during the soak: {g}" for g in self.soak_verdict.get("grew", [])]
        return out

    def ok(self) -> bool:
        return not self.problems()

    def summary(self) -> str:
        faults = ", ".join(f"{k} {v}" for k, v in sorted(self.faults.items()))
        return (
            f"seed {self.seed}: faults [{faults}]; leaks injected {self.leaks_injected}, released "
            f"{self.leaks_released}, outstanding {len(self.leaks_outstanding)}; max latency "
            f"{self.max_latency:.1f}s, last release {self.max_after_heal:.1f}s after the heal; "
            f"violations {len(self.violations)}; "
            + (
                f"nodes deleted {self.nodes_deleted}, freed {self.nodes_freed} (max "
                f"{self.node_max_latency:.1f}s after due); "
                if self.nodes_deleted
                else ""
            )
            + f"restarts {self.restarts}; {self.elapsed:.0f}s"
            + (f"; tolerated: {'; '.join(self.tolerated)}" if self.tolerated else "")
            + f"; logs {self.log_dir}"
        )


@dataclass
class StaleLeader:
    """A leader process that went stale (its Lease handed over, or frozen past it), from `since` (wall
    time) until that process ended: any IPAM write it made then is a fencing failure."""

    identity: str
    pid: int | None
    since: float
    until: float | None = None
