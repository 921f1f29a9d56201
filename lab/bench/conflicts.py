"""`ipamgc bench --conflicts SECONDS`: Calico's CNI writing the very blocks the collector is releasing
leaks from, so that the collector's conditional writes conflict often (projectcalico/calico#13404: one
conflict on a stale block aborted the whole pass, and cleanup did not complete for days).

Why a module: the phase is the same for ipamgc's processes (`run.ModeRun`) and Calico's binary
(`calico.CalicoRun`, in its run at the short grace: at its production grace no leak is released within a
run); the caller passes in how its cost is read.  The workload, at the phase's start:
- `HOT_NODES` nodes (drawn from a generator of the phase's own, so both collectors get the same ones) each
  get `LEAKS_PER_NODE` pods created then deleted without CNI DEL: leaks, due after the grace period;
- from then on, for `conflicts_seconds` (at least the grace period + 10 s, so the releases fall inside),
  the CNI on each hot node starts a pod and removes its oldest `CNI_RATE_PER_NODE` times a second
  (CNI ADD, status; DELETE, CNI DEL): every one of them a write to the block the leaks are in.
Measured: the collector's writes to IPAM blocks and how many the API server refused with 409 Conflict
(every HTTP write to a block in the phase is the collector's: the CNI writes in-process), each leak's
release after its grace (p50 / p99 / max), the leaks never released (`unreleased`, after the grace
period + `LEAK_WAIT_MARGIN_SECONDS` beyond the CNI's end), IPs in use released (the run's violations).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

from lab.apiserver.store import SimApiError
from lab.bench import measure
from lab.bench.nodechurn import Phased
from lab.bench.observe import LEAK_WAIT_MARGIN_SECONDS
from lab.cluster.cni import PoolExhausted

HOT_NODES = 4
LEAKS_PER_NODE = 25
CNI_RATE_PER_NODE = 20.0  # pods started (and as many removed) per second on each hot node
CNI_PODS_PER_NODE = 10  # the pods the CNI keeps running on a hot node, oldest removed first
SEED_OFFSET = 13  # the phase's own generator: `random.Random(seed + SEED_OFFSET)`

BLOCK_WRITES = ("update", "patch", "delete")


def run_phase(
    run: Phased,
    before: Callable[[], None],
    cost: Callable[[measure.Reading, measure.Reading, int], dict[str, Any]],
    requests: Callable[[], list[Any]],
) -> None:
    """The conflicts phase of `run` (either collector), into `run.result["phases"]["conflicts"]`; `before`
    brings the collector to rest, `cost(start, end, events)` reads the phase's cost, `requests()` the API
    server's request log."""
    cfg, sim = run.cfg, run.sim
    before()
    rng = random.Random(cfg.seed + SEED_OFFSET)
    hot = sorted(rng.sample(sorted(sim.node_names), min(HOT_NODES, len(sim.node_names))))
    seconds = max(cfg.conflicts_seconds, cfg.grace + 10.0)
    run.say(
        f"conflicts: {LEAKS_PER_NODE} leaks on each of {len(hot)} nodes, their CNI starting "
        f"{CNI_RATE_PER_NODE:g} pods/s each for {seconds:g} s (grace {cfg.grace:g} s)"
    )
    start = run.start_phase()
    for node in hot:
        for i in range(LEAKS_PER_NODE):
            name = f"conflict-leak-{node}-{i}"
            sim.create_pod("bench", name, node)
            sim.leak_pod_deleted_without_cni_del("bench", name)
    leaked = time.time()
    lives = measure.lives_leaked_between(sim.truth, start.wall, leaked)
    running: dict[str, list[str]] = {node: [] for node in hot}
    events = errors = 0
    began = time.monotonic()
    ticks = round(seconds * CNI_RATE_PER_NODE)
    for tick in range(ticks):
        for node in hot:
            name = f"conflict-cni-{node}-{tick}"
            try:
                sim.create_pod("bench", name, node)
                running[node].append(name)
                events += 1
                if len(running[node]) > CNI_PODS_PER_NODE:
                    sim.delete_pod("bench", running[node].pop(0))
                    events += 1
            except (PoolExhausted, SimApiError):  # a load generator goes on; what failed is counted
                errors += 1
        delay = began + (tick + 1) / CNI_RATE_PER_NODE - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    cni_seconds = time.monotonic() - began
    run.wait(
        "the conflicts phase's leaks to be released",
        lambda: all(x.freed_at is not None for x in lives),
        cfg.grace + LEAK_WAIT_MARGIN_SECONDS,
    )
    end = run.reading()
    phase = cost(start, end, len(lives))
    phase["events_are"] = "leaks released from blocks the CNI writes"
    writes = [
        r
        for r in requests()
        if start.wall <= r.timestamp <= end.wall and r.resource == "ipamblocks" and r.verb in BLOCK_WRITES
    ]
    conflicts = sum(1 for r in writes if r.status == 409)
    released, unreleased = measure.release_latencies(lives, cfg.grace)
    phase.update(
        {
            "hot_nodes": hot,
            "leaks": len(lives),
            "cni_pod_events": events,
            "cni_errors": errors,
            "cni_seconds": round(cni_seconds, 3),
            "cni_achieved_rate": round(events / max(cni_seconds, 1e-9), 1),
            "collector_block_writes": len(writes),
            "collector_block_conflicts": conflicts,
            "leak_to_release_minus_grace": {**measure.percentiles(released), "unreleased": unreleased},
        }
    )
    run.result["phases"]["conflicts"] = phase
    lat = phase["leak_to_release_minus_grace"]
    run.say(
        f"  {len(lives)} leaks: {conflicts} of {len(writes)} block writes conflicted; release − grace "
        f"p50 {lat['p50']} s, p99 {lat['p99']} s, {unreleased} unreleased"
    )
