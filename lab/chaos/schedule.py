"""The faults of a chaos run, and what the run's components are told: a pure function of the options and
the seed (`schedule`), so `python -m lab.chaos --seed N` replays a run.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab.cluster.podshape import PodSize

LEASE_NAMESPACE = "kube-system"


LEADER_LEASE = "ipamgc-leader"


CALICO_IPAM = ("ipamblocks", "ipamhandles", "blockaffinities")


WRITES = ("POST", "PUT", "PATCH", "DELETE")


FAULT_KINDS = (
    "kill-watcher",
    "kill-worker",
    "kill-leader",
    "redis-restart",
    "redis-rollback",
    "api-errors",
    "latency",
    "drop-watches",
    "expire-410",
    "conflict-storm",
    "stale-leader",
)


# Faults a run injects only when asked (`--faults`): the run's Redis becomes a master, a replica and three
# sentinels (`lab.chaos.redisha`) for the failovers; the memory limit is opt-in with them.
REDIS_OPT_IN_FAULTS = (
    "redis-failover",  # SENTINEL FAILOVER: the replica promoted, the old master demoted
    "redis-failover-lossy",  # the replica cut off for `lag` s of writes, then the master killed
    "redis-maxmemory",  # maxmemory below the used memory (noeviction) for `length` s, then restored
    "redis-flushall",  # FLUSHALL: every key gone at once, the server still up (an operator's mistake)
)
# Node churn (`lab.chaos.nodechurn`) is opt-in too: with the default faults, default-length runs failed
# 2 of 5 on leaks (a Redis rollback ended after an empty restart, a failure the default set alone shows
# too, 1 of 2), never on a deleted node; docs/chaos.md, "Node churn".
OPT_IN_FAULTS = (*REDIS_OPT_IN_FAULTS, "node-churn")
ALL_FAULT_KINDS = FAULT_KINDS + OPT_IN_FAULTS
SENTINEL_FAULTS = frozenset({"redis-failover", "redis-failover-lossy"})
# Seconds a failover is given before the run joins it (the sentinels take 2-4 s here; the run waits longer
# if need be, never less).
FAILOVER_WINDOW = 8.0

# node-churn (`lab.chaos.nodechurn`): a third of the cluster's nodes (at least two) replaced over 40 % of
# the run, half of them terminated abruptly, whose delays are the real ones ÷ 40: NotReady after 1 s
# (node-monitor-grace-period, 40 s), the Node object deleted after 1.5 s (the cloud's node lifecycle
# controller, or Karpenter, ~60 s), the pod GC of its pods 1 s later (its orphan quarantine, ~40 s).
NODE_NOT_READY_AFTER = 1.0
NODE_DELETED_AFTER = 1.5
NODE_POD_GC_AFTER = 1.0
NODE_CHURN_TAIL = NODE_DELETED_AFTER + NODE_POD_GC_AFTER  # seconds after the last replacement
NODE_CHURN_SHARE = 1 / 3
NODE_CHURN_ABRUPT = 0.5


# Requests only the active leader makes: a kill on one of them lands in the middle of a release.
LEADER_RELEASE_REQUESTS = (
    ("get", "pods"),
    ("get", "ipamblocks"),
    ("update", "ipamblocks"),
    ("update", "ipamhandles"),
)


# Component timings for a run measured in seconds (every one is an `IPAMGC_*` variable of shared/config).
COMPONENT_ENV = {
    "IPAMGC_KICK_INTERVAL": "0.2",
    "IPAMGC_BATCH_WAIT": "0.05",
    "IPAMGC_BACKOFF_BASE": "0.05",
    "IPAMGC_BACKOFF_MAX": "0.5",
    "IPAMGC_ELECTION_LEASE": "2",
    "IPAMGC_ELECTION_RENEW": "1.5",
    "IPAMGC_ELECTION_RETRY": "1",
    "IPAMGC_ELECTION_NAMESPACE": LEASE_NAMESPACE,
    "IPAMGC_WORK_LEASE": "2",
    "IPAMGC_JOB_BUDGET": "2",
    "IPAMGC_WATCH_TIMEOUT": "30",
    "IPAMGC_METRICS_PORT": "0",  # no /metrics listener per process (loopback-only runs)
}


@dataclass(frozen=True, slots=True)
class ChaosOptions:
    seed: int = 0
    nodes: int = 5
    pods_per_node: int = 6
    churn: float = 4.0  # pod events per second during the fault phase
    leak_rate: float = 0.3  # fraction of churn deletions without CNI DEL
    grace: float = 2.0  # the cluster's leakGracePeriod, seconds
    workers: int = 3
    duration: float = 18.0  # seconds of faults
    settle_seconds: float = 10.0  # every leak released within grace + this after the heal
    faults: tuple[str, ...] = FAULT_KINDS
    log_dir: Path | None = None
    pod_size: PodSize = "small"  # the simulated pods' size (`lab.cluster.podshape`)
    # The soak (`lab.chaos.soak`): periodic faults instead of the schedule, figures per window.
    soak: bool = False
    soak_compress: float = 1.0  # every soak period divided by this
    soak_max_slope: float = 1.0  # % an hour a series may grow after the warm-up


@dataclass(frozen=True, slots=True)
class Fault:
    """One scheduled fault: at `at` seconds into the fault phase, for `length` seconds (windows)."""

    at: float
    kind: str
    length: float = 0.0
    params: tuple[tuple[str, Any], ...] = ()

    def param(self, name: str, default: Any = None) -> Any:
        return dict(self.params).get(name, default)


def schedule(opts: ChaosOptions) -> list[Fault]:
    """The faults of a run: a pure function of the options (the seed above all).

    First half: the leader faults, while the system is otherwise healthy, each preceded by its fuel (two
    pods deleted without CNI DEL, whose IPs are confirmed leaks one grace period later, so that the
    leader is releasing when the fault is armed).  Second half: the windowed API faults, at seeded times
    and rates, and the process and Redis faults among them, in a seeded order.  Leak scenarios anywhere.
    """
    rng = random.Random(opts.seed)
    d = opts.duration
    g = opts.grace
    out: list[Fault] = []
    wanted = set(opts.faults)
    unknown = wanted - set(ALL_FAULT_KINDS)
    if unknown:
        raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {', '.join(ALL_FAULT_KINDS)}")

    def r(x: float) -> float:
        return round(x, 2)

    # -- first half: a leader killed mid-release, then two leaders (one stale) ---------------------------
    t = 0.02 * d
    for kind in ("kill-leader", "stale-leader"):
        if kind not in wanted:
            continue
        out.append(Fault(r(t), "scenario", params=(("name", "fuel"),)))
        window = max(0.15 * d, g + 1.0)
        if kind == "kill-leader":
            verb, resource = LEADER_RELEASE_REQUESTS[rng.randrange(len(LEADER_RELEASE_REQUESTS))]
            params: tuple[tuple[str, Any], ...] = (("verb", verb), ("resource", resource))
        else:
            params = (("variant", rng.choice(("takeover", "pause"))),)
        out.append(Fault(r(t + g * 0.8), kind, r(window), params))
        t += g * 0.8 + window
    half = max(t, 0.45 * d)

    # -- second half: API faults in windows, process and Redis faults among them ------------------------
    def at() -> float:
        return r(rng.uniform(half, 0.9 * d))

    if "api-errors" in wanted:
        rates = (
            ("p500", r(rng.uniform(0.05, 0.2))),
            ("p429", r(rng.uniform(0.02, 0.1))),
            ("p503", r(rng.uniform(0.02, 0.1))),
        )
        out.append(Fault(at(), "api-errors", r(rng.uniform(0.15, 0.3) * d), rates))
    if "latency" in wanted:
        out.append(Fault(at(), "latency", r(0.15 * d), (("seconds", r(rng.uniform(0.05, 0.2))),)))
    if "drop-watches" in wanted:
        out.append(Fault(at(), "drop-watches", r(0.15 * d), (("rate", round(rng.uniform(0.01, 0.05), 3)),)))
    if "conflict-storm" in wanted:
        out.append(Fault(at(), "conflict-storm", r(0.2 * d), (("per_second", 60),)))
    discrete = [
        k
        for k in (
            "kill-watcher",
            "kill-worker",
            "expire-410",
            "redis-restart",
            "redis-rollback",
            *REDIS_OPT_IN_FAULTS,
        )
        if k in wanted
    ]
    rng.shuffle(discrete)
    slot = (0.9 * d - half) / max(1, len(discrete))
    for i, kind in enumerate(discrete):
        when = r(half + i * slot + rng.uniform(0.0, 0.3) * slot)
        if kind == "kill-worker":
            point = rng.choice(("mid-batch", "between-batches"))
            out.append(Fault(when, kind, r(max(0.8 * slot, 2.5)), (("point", point),)))
        elif kind == "redis-restart":
            out.append(Fault(when, kind, 0.0, (("down", r(rng.uniform(0.2, 1.0))),)))
        elif kind == "redis-rollback":  # the writes of these seconds are lost when it ends
            out.append(Fault(when, kind, r(rng.uniform(1.0, 4.0))))
        elif kind == "redis-failover-lossy":  # the writes of `lag` seconds never reach the replica
            lag = r(rng.uniform(1.0, 3.0))
            out.append(Fault(when, kind, r(lag + FAILOVER_WINDOW), (("lag", lag),)))
        elif kind == "redis-failover":
            out.append(Fault(when, kind, FAILOVER_WINDOW))
        elif kind == "redis-flushall":
            out.append(Fault(when, kind))
        elif kind == "redis-maxmemory":  # every write refused (OOM) for these seconds
            out.append(Fault(when, kind, r(rng.uniform(2.0, 4.0))))
        else:
            out.append(Fault(when, kind))
    # Leak scenarios beside the churn's (pods deleted without CNI DEL): a node lost with its pods, an IP
    # changed under a live pod, a finished pod.
    for name in ("node-lost", "ip-changed", "terminal-pod"):
        out.append(Fault(r(rng.uniform(0.05, 0.85) * d), "scenario", params=(("name", name),)))
    # Last, so that adding it left every other fault of a seed where it was.  Early enough that its window
    # and the abrupt nodes' pod GC end before the heal.
    if "node-churn" in wanted:
        window = r(0.4 * d)
        replaced = max(2, round(opts.nodes * NODE_CHURN_SHARE))
        params = (("window", window), ("replaced", replaced), ("abrupt", NODE_CHURN_ABRUPT))
        out.append(Fault(r(rng.uniform(0.05, 0.3) * d), "node-churn", r(window + NODE_CHURN_TAIL), params))
    return sorted(out, key=lambda f: (f.at, f.kind))
