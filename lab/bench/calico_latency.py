"""Calico's binary, its latency run: a second start on the same seeded cluster at the benchmark's short
grace, where its leak → release latency is measured (`churn_short_grace`) and the conflicts phase runs.

Why a module of its own: `lab/bench/calico.py` is the binary's cost run and its plumbing; this is the
run whose CPU is not a cost figure (Calico scans everything every grace / 2 here), kept apart so that the
two cannot be read together by mistake.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from lab.bench import conflicts, measure

if TYPE_CHECKING:
    from lab.bench.calico import CalicoRun

LEAK_WAIT_MARGIN_SECONDS = 60.0


def latency_run(run: CalicoRun) -> None:
    """The latency run: a second start of the binary on the same seeded cluster at the benchmark's short
    grace: its churn again (`churn_short_grace`) and the conflicts phase."""
    cfg = run.cfg
    with run.cluster(cfg.grace, "latency"):
        run.start("latency")
        run.wait("Calico's syncer to be in sync", lambda: run.log.count("in-sync") > 0)
        # At a short grace Calico scans everything every grace / 2 and is never quiet: let two scans
        # pass, so the churn starts on a collector in its steady state.
        time.sleep(max(1.0, cfg.grace))
        if cfg.churn_seconds:
            _churn_short_grace(run)
        if cfg.conflicts_seconds:  # no rest before it: at a short grace Calico is never quiet
            conflicts.run_phase(run, lambda: None, run.phase, lambda: run.server.requests)


def _churn_short_grace(run: CalicoRun) -> None:
    """The churn again, at the short grace: Calico's leak → release latency (`churn_short_grace`)."""
    cfg = run.cfg
    run.say(f"{run.mode}: churn {cfg.churn_rate}/s for {cfg.churn_seconds} s (grace {cfg.grace:g} s)")
    start = run.start_phase()
    stats = run.drive_churn()
    stopped = time.time()
    lives = measure.lives_leaked_between(run.sim.truth, start.wall, stopped)
    run.wait(
        "the leaks to be released",
        lambda: all(x.freed_at is not None for x in lives),
        cfg.grace + LEAK_WAIT_MARGIN_SECONDS,
    )
    end = run.reading()
    phase = run.phase(start, end, stats.events)
    released, unreleased = measure.release_latencies(lives, cfg.grace)
    phase.update(
        {
            "events_are": "pod events (creations, clean deletions, leaking deletions)",
            "leaks": len(lives),
            "grace_seconds": cfg.grace,
            "leak_to_release_minus_grace": {
                **measure.percentiles(released),
                "unreleased": unreleased,
            },
            "note": "includes Calico's full scan every grace / 2: not a cost figure",
        }
    )
    run.result["phases"]["churn_short_grace"] = phase
    churn = run.result["phases"].get("churn")
    if churn is not None:
        churn["leak_to_release_minus_grace"] = phase["leak_to_release_minus_grace"]
        churn["leak_latency_from"] = f"churn_short_grace (grace {cfg.grace:g} s)"
    lat = phase["leak_to_release_minus_grace"]
    run.say(
        f"  {len(lives)} leaks, release − grace p50 {lat['p50']} s, p99 {lat['p99']} s, "
        f"{unreleased} unreleased"
    )
