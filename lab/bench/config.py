"""The benchmark's parameters: one frozen dataclass, defaults that say why they are what they are.

Why a module of its own: the command line (`lab/commands/bench.py`), the runner and the smoke test all
build the same `BenchConfig`, and the JSON report records it whole, so a figure can always be traced back
to the exact workload that produced it.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from lab.cluster.nodechurn import PRESETS as NODE_CHURN_PRESETS
from lab.cluster.podshape import POD_SIZES

# The modes, in the order `all` runs them:
# - incremental: ipamgc as it ships (per-allocation dirty tracking, candidates re-checked when due);
# - per-node: Calico 3.30–3.33's per-node dirty tracking (#9654, `IPAMGC_PER_NODE=1` for the watcher and
#   the workers): every allocation of a node an event touched is re-validated, a candidate on a clean
#   node waits for its node to be dirtied again or for the periodic full scan;
# - full-scan: Calico 3.26 (#7841, `IPAMGC_FULL_SCAN=1` for the watcher): every sync re-validates
#   everything.
# - combined: incremental, its watcher, one worker for every shard and its leader in one process
#   (`ipamgc combined`): what the process count costs; not part of `all`, which stays what it was.
ALL_MODES = ("incremental", "per-node", "full-scan")  # `all`, the default
MODES = (*ALL_MODES, "combined")
# - calico: Calico's own kube-controllers (a binary the user gives: `calico_binaries`), one mode per binary
#   (`lab/bench/calico.py`); never part of `all`, which stays what it was.
CALICO = "calico"
# Names that stand for several modes: `all`, and `both`, the two modes of the first benchmark (kept so
# that existing command lines still run what they ran).
MODE_ALIASES = {"all": ALL_MODES, "both": ("incremental", "full-scan")}


def parse_modes(text: str) -> tuple[str, ...]:
    """`--mode`: a comma-separated list of modes and aliases, in the order given, each mode once."""
    out: list[str] = []
    for raw in text.split(","):
        name = raw.strip()
        if name not in MODES and name not in MODE_ALIASES and name != CALICO:
            known = ", ".join([*MODES, CALICO, *MODE_ALIASES])
            raise ValueError(f"unknown mode {name!r} in {text!r}: expected a comma-separated list of {known}")
        out += [m for m in MODE_ALIASES.get(name, (name,)) if m not in out]
    return tuple(out)


# The environment flags (`Settings.full_scan`, `Settings.per_node`) that make a mode, per role: both are
# always set, to "0" where off, so that a flag inherited from the shell cannot turn one mode into another.
# full-scan is the watcher's alone (its workers validate as usual); per-node changes the workers too (they
# write no due times: a candidate on a clean node is not re-checked when its grace ends).
MODE_FLAGS = ("IPAMGC_FULL_SCAN", "IPAMGC_PER_NODE")
_MODE_ROLES = {
    "full-scan": ("IPAMGC_FULL_SCAN", ("watcher",)),
    "per-node": ("IPAMGC_PER_NODE", ("watcher", "workers")),
}


def mode_env(mode: str, role: str) -> dict[str, str]:
    """The mode flags for one component (`role`: watcher, workers, leader) of a run in `mode`."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}")
    env = dict.fromkeys(MODE_FLAGS, "0")
    flag, roles = _MODE_ROLES.get(mode, ("", ()))
    if role in roles:
        env[flag] = "1"
    return env


@dataclass(frozen=True, slots=True)
class BenchConfig:
    # -- the cluster ---------------------------------------------------------------------------------------
    # 200 nodes × 50 pods is #7841's cluster (~10,000 pods), where Calico 3.26 burnt a full CPU.
    nodes: int = 200
    pods_per_node: int = 50
    # Seconds of no events after the cold start: the fixed cost per second (lease renewals, kicks, the
    # leader's polls, RQ heartbeats), which the churn figures are also given net of.  20 s, not less: the
    # periodic work (Lease renewals every 2 s, heartbeats every 5 s, the leader's cleanup passes) falls
    # unevenly in a shorter phase, and a process whose thread ended is read in 10 ms ticks
    # (`procs.cpu_delta`): ±2 ms/s per process over 5 s, more than the ≤ 5 ms/s the system is held to.
    idle_seconds: float = 20.0
    # -- steady churn ---------------------------------------------------------------------------------------
    # Pod events (creations and deletions) per second, and for how long.
    churn_rate: float = 50.0
    churn_seconds: float = 20.0
    # `--churn 1,5,20,50`: every rate, in this order, one churn phase each (`lab/bench/sweep.py`);
    # `churn_rate` is then the last.  Empty (or one rate): the single churn phase.
    churn_rates: tuple[float, ...] = ()
    # Fraction of deletions that skip CNI DEL (each one a leak to release after the grace period).
    leak_rate: float = 0.05
    # -- node loss ------------------------------------------------------------------------------------------
    # Nodes deleted with their pods, all at once; each is first topped up to `node_loss_pods` pods
    # (110: the kubelet's default max-pods, the worst case of "a deleted node cleaned within 5 s").
    node_loss: int = 2
    node_loss_pods: int = 110
    # -- node churn (`lab/bench/nodechurn.py`) ---------------------------------------------------------
    # A preset of `lab.cluster.nodechurn.PRESETS` (`7839`, `hard`): nodes replaced continuously, as an
    # autoscaler does, in a pool small enough to run out; the cluster (nodes, pods per node, the pool) is
    # the preset's.  None: no node-churn phase.
    node_churn: str | None = None
    # Periods of replacements the phase runs (a preset's period is its compressed 15 or 10 minutes).
    node_churn_periods: float = 2.0
    # -- conflicts (`lab/bench/conflicts.py`) ----------------------------------------------------------
    # Seconds of the CNI writing the blocks the collector releases leaks from (at least grace + 10 s);
    # 0: no conflicts phase.  Calico's binary runs it in its short-grace run.
    conflicts_seconds: float = 0.0
    # -- ipamgc ---------------------------------------------------------------------------------------------
    workers: int = 2
    # Shards (ipamgc's default, 4: shared/shard.py): each batch of events makes work on every shard it
    # touched (a held shard's long-lived job looks at it; an unheld one gets an RQ job).
    shards: int = 4
    # The watcher's batch wait (ipamgc's default, 1 s): events merged into one batch (and one job per
    # shard) per this many seconds.
    batch_wait: float = 1.0
    # Leak grace period (written to KubeControllersConfiguration/default, as an operator would).
    grace: float = 2.0
    # The watcher's `--kick-interval`, production's: a kick runs when a grace period ends (the due times
    # on `P:wakeups`), so this ceiling no longer sets the leak latency (until 2026-12-04 the benchmark ran
    # 1 s, a kick a second in every idle figure).
    kick_interval: float = 30.0
    # The watcher's full-resync period.  Calico's (and ipamgc's default) is grace / 2: with the
    # benchmark's short grace that would be a full scan every second, in incremental mode too.  The
    # default is what a production grace of 15 minutes gives, so no periodic resync falls in a run.
    resync_period: float = 450.0
    # Run the leader (`ipamgc lead`) and measure leak → release; without it, leak → decision.
    leader: bool = True
    # The leader's IP releases per second (its production default; 0 = unlimited).
    leader_rate_limit: float = 50.0
    # -- Calico's own kube-controllers (mode `calico`) ---------------------------------------------------
    # (name, path) of each binary: mode `calico` for one unnamed binary, `calico-<name>` for each of several.
    calico_binaries: tuple[tuple[str, str], ...] = ()
    # The grace period of Calico's cost run: its full scan runs every grace / 2 and cannot be set apart, so
    # its CPU is measured at the production default (no periodic scan inside the run), its leak latency in a
    # second run at `grace` (lab/bench/calico.py).
    calico_grace: float = 900.0
    # -- the backstop phase (`lab/bench/backstop.py`) -------------------------------------------------
    # Periodic passes measured per mode, one at a time: ipamgc's watcher runs its backstop on SIGUSR1
    # after the idle phase; Calico's binary gets a third run at `calico_backstop_grace`, one measured
    # window per full scan of its ticker.  0: no backstop phase (the report's `backstop` and `hourly`
    # are null), so a default run is not slower.
    backstop_passes: int = 0
    # The grace period of Calico's backstop run: its full scan every grace / 2 (Calico 3.33's ticker,
    # kube-controllers/pkg/controllers/node/ipam.go), so 60 s puts one scan in each 30 s window: long
    # enough for a scan to end and its process to go quiet before the next at the sizes measured.
    calico_backstop_grace: float = 60.0
    # -- the pods -------------------------------------------------------------------------------------------
    # The simulated pods' size (docs/pod-sizes.md): `real` (~13.8 KB of JSON, a Deployment's pod with
    # managedFields, what users run), `small` (~0.4 KB: every figure before 2026-12-04 evening), `large`.
    pod_size: str = "real"
    # -- the API server ---------------------------------------------------------------------------------
    # A directory with bin/kube-apiserver and bin/etcd (what .ci/realapi-build prints): every mode runs
    # against a real kube-apiserver + etcd on loopback instead of the simulated API server
    # (lab/bench/backend.py).  None: the simulated one.
    kube_apiserver: str | None = None
    # -- the run --------------------------------------------------------------------------------------------
    modes: tuple[str, ...] = ALL_MODES
    # Full scan re-validates everything on every batch: above this many pods it runs for ages (and is
    # the #7841 failure this project exists to avoid).  It is skipped above this size, with a note
    # (full-scan only: per-node scans only the nodes an event touched, and always runs).
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
            "backstop_passes",
            "conflicts_seconds",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")
        if any(not rate > 0 for rate in self.churn_rates):
            raise ValueError("every churn rate must be positive")
        if not 0.0 <= self.leak_rate <= 1.0:
            raise ValueError("leak_rate must be within 0..1")
        if self.node_loss > self.nodes - 1:
            raise ValueError("node_loss must leave at least one node")
        unknown = [m for m in self.modes if m not in (*MODES, CALICO)]
        if unknown or not self.modes or len(set(self.modes)) != len(self.modes):
            raise ValueError(f"modes must be some of {(*MODES, CALICO)}, each once, got {self.modes}")
        if "combined" in self.modes and not self.leader:
            raise ValueError("mode combined runs the leader in its one process: it cannot run without it")
        if not self.calico_grace > 0:
            raise ValueError("calico_grace must be positive")
        if self.node_churn is not None and self.node_churn not in NODE_CHURN_PRESETS:
            known = ", ".join(NODE_CHURN_PRESETS)
            raise ValueError(f"node_churn must be one of {known}, got {self.node_churn!r}")
        if not self.node_churn_periods > 0:
            raise ValueError("node_churn_periods must be positive")
        if self.pod_size not in POD_SIZES:
            raise ValueError(f"pod_size must be one of {', '.join(POD_SIZES)}, got {self.pod_size!r}")
        if not self.calico_backstop_grace > 0:
            raise ValueError("calico_backstop_grace must be positive")
        if self.kube_apiserver is not None:
            for name in ("kube-apiserver", "etcd"):
                binary = Path(self.kube_apiserver) / "bin" / name
                if not os.access(binary, os.X_OK):
                    raise ValueError(
                        f"kube_apiserver: no executable {binary} (bash .ci/realapi-build builds it)"
                    )

    @property
    def pods(self) -> int:
        return self.nodes * self.pods_per_node

    def pools(self) -> list[tuple[str, int]] | None:
        """The simulated cluster's IP pools: the node-churn preset's small pool, else the default."""
        if self.node_churn is None:
            return None
        return NODE_CHURN_PRESETS[self.node_churn].scaled(self.nodes, self.pods_per_node).pools()

    def grace_duration(self) -> str:
        """The grace period as a Go duration, as KubeControllersConfiguration stores it."""
        return f"{round(self.grace * 1000)}ms"

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["modes"] = list(self.modes)
        out["churn_rates"] = list(self.churn_rates)
        out["calico_binaries"] = [list(pair) for pair in self.calico_binaries]
        out["pods"] = self.pods
        return out
