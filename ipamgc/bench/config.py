"""The benchmark's parameters: one frozen dataclass, defaults that say why they are what they are.

Why a module of its own: the command line (`ipamgc/commands/bench.py`), the runner and the smoke test all
build the same `BenchConfig`, and the JSON report records it whole, so a figure can always be traced back
to the exact workload that produced it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

MODES = ("incremental", "full-scan")


@dataclass(frozen=True, slots=True)
class BenchConfig:
    # -- the cluster ---------------------------------------------------------------------------------------
    # 200 nodes × 50 pods is #7841's cluster (~10,000 pods), where Calico 3.26 burnt a full CPU.
    nodes: int = 200
    pods_per_node: int = 50
    # Seconds of no events after the cold start: the fixed cost per second (lease renewals, kicks, the
    # leader's polls, RQ heartbeats), which the churn figures are also given net of.
    idle_seconds: float = 5.0
    # -- steady churn ---------------------------------------------------------------------------------------
    # Pod events (creations and deletions) per second, and for how long.
    churn_rate: float = 50.0
    churn_seconds: float = 20.0
    # Fraction of deletions that skip CNI DEL (each one a leak to release after the grace period).
    leak_rate: float = 0.05
    # -- node loss ------------------------------------------------------------------------------------------
    # Nodes deleted with their pods, all at once; each is first topped up to `node_loss_pods` pods
    # (110: the kubelet's default max-pods, the worst case of "a deleted node cleaned within 5 s").
    node_loss: int = 2
    node_loss_pods: int = 110
    # -- ipamgc ---------------------------------------------------------------------------------------------
    workers: int = 2
    # Shards (ipamgc's default, 16): each batch of events arms one RQ job per shard it touched.
    shards: int = 16
    # The watcher's batch wait (ipamgc's default, 1 s): events merged into one batch (and one job per
    # shard) per this many seconds.
    batch_wait: float = 1.0
    # Leak grace period (written to KubeControllersConfiguration/default, as an operator would).
    grace: float = 2.0
    # The watcher's `--kick-interval`: how late a candidate whose grace ended is re-checked at worst.  The
    # production default (5 s) is nothing next to a 15-minute grace period, but would dominate a 2 s one.
    kick_interval: float = 1.0
    # The watcher's full-resync period.  Calico's (and ipamgc's default) is grace / 2: with the
    # benchmark's short grace that would be a full scan every second, in incremental mode too.  The
    # default is what a production grace of 15 minutes gives, so no periodic resync falls in a run.
    resync_period: float = 450.0
    # Run the leader (`ipamgc lead`) and measure leak → release; without it, leak → decision.
    leader: bool = True
    # The leader's IP releases per second (its production default; 0 = unlimited).
    leader_rate_limit: float = 50.0
    # -- the run --------------------------------------------------------------------------------------------
    modes: tuple[str, ...] = MODES
    # Full scan re-validates everything on every batch: above this many pods it runs for ages (and is
    # the #7841 failure this project exists to avoid).  `mode both` skips it above this size, with a note.
    full_scan_max_pods: int = 20_000
    seed: int = 0
    # Seconds any single wait (sync, drain, leak release) may take before the phase is marked timed out.
    timeout: float = 600.0

    def __post_init__(self) -> None:
        for name in ("nodes", "pods_per_node", "workers", "shards"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        for name in ("churn_rate", "kick_interval", "resync_period", "timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")
        for name in (
            "idle_seconds",
            "churn_seconds",
            "grace",
            "leader_rate_limit",
            "node_loss",
            "node_loss_pods",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")
        if not 0.0 <= self.leak_rate <= 1.0:
            raise ValueError("leak_rate must be within 0..1")
        if self.node_loss > self.nodes - 1:
            raise ValueError("node_loss must leave at least one node")
        unknown = [m for m in self.modes if m not in MODES]
        if unknown or not self.modes:
            raise ValueError(f"modes must be some of {MODES}, got {self.modes}")

    @property
    def pods(self) -> int:
        return self.nodes * self.pods_per_node

    def grace_duration(self) -> str:
        """The grace period as a Go duration, as KubeControllersConfiguration stores it."""
        return f"{round(self.grace * 1000)}ms"

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["modes"] = list(self.modes)
        out["pods"] = self.pods
        return out
