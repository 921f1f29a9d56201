"""What a benchmark phase measures, and how it knows the system under test is done with it.

Why a module of its own: a phase's numbers mean something only if it starts and ends at the right
moment.  :class:`Observing` (which `lab.bench.run.ModeRun` extends) takes the readings that bracket a
phase (CPU and peak memory of every process, the Redis commands), and decides when the processes have
caught up with the simulated cluster: a sentinel pod mirrored, nothing pending anywhere, every leak of
the phase released (or decided, without a leader) and the leader's reads acked; then it turns the ground
truth and the decisions into leak latencies.  The phases themselves are in `lab/bench/run.py`, the
process plumbing in `lab/bench/harness.py`, the arithmetic in `lab/bench/measure.py`.
"""

from __future__ import annotations

import time
from typing import Any

from lab.bench import measure
from lab.bench.harness import Harness
from lab.bench.procs import thread_cpu_seconds
from lab.cluster.cluster import SimCluster
from lab.cluster.truth import Usage as Life
from shared.model import allocation_id

__all__ = ["LEAK_WAIT_MARGIN_SECONDS", "Observing"]

LEAK_WAIT_MARGIN_SECONDS = 60.0  # beyond the grace period, for the last leaks of a phase


class Observing(Harness):
    """The readings that bracket a phase, its end (caught up, settled), and its leaks' latencies."""

    sim: SimCluster  # the simulated cluster of the run (set by the run)

    # -- readings ----------------------------------------------------------------------------------------

    def reading(self) -> measure.Reading:
        watchers = self.fleet.watchers()
        threads = thread_cpu_seconds(watchers[0].pid) if watchers and watchers[0].alive() else {}
        return measure.Reading(
            time.monotonic(), time.time(), self.fleet.usage(), self.probe.commands(), threads
        )

    def start_phase(self) -> measure.Reading:
        self.fleet.reset_peaks()
        return self.reading()

    # -- the end of a phase ------------------------------------------------------------------------------

    def _caught_up(self, tag: str) -> None:
        """A sentinel pod created last: once it and its allocation are mirrored and nothing is dirty, the
        watcher has applied every earlier event of both watches and the workers have validated them."""
        name, node, ips = measure.create_sentinel(self.sim, tag)
        handle, _ = self.sim.pod_handles[("bench", name)]
        alloc = allocation_id(handle, ips[0])
        self.wait(
            f"the watcher to catch up ({tag})",
            lambda: self.probe.pod_mirrored("bench", name) and self.probe.allocation_mirrored(node, alloc),
        )
        self.wait(f"everything to be validated ({tag})", self.probe.quiescent)

    def _settle(self, lives: list[Life], since_wall: float, leak_wait_limit: float | None = None) -> bool:
        """Until every leak in `lives` is released (decided, without a leader), nothing is pending
        anywhere, and the leader has acked everything it read.

        With `leak_wait_limit` (per-node mode's churn): first until nothing is pending, then for the
        leaks at most `leak_wait_limit` seconds, a wait that may run out by design (not a timeout: the
        leaks left are reported as unreleased), then until nothing is pending again (the releases dirty
        their nodes).  Returns whether every leak was released (decided)."""
        budget = self.cfg.grace + LEAK_WAIT_MARGIN_SECONDS
        if self.cfg.leader:
            what = "the leaks to be released"

            def settled() -> bool:
                return all(x.freed_at is not None for x in lives)
        else:
            what, since_ms = "the leaks to be decided", int(since_wall * 1000)

            def settled() -> bool:
                got = {(d.handle, d.ip) for d in self.probe.decisions(since_ms)}
                return all((x.handle, x.ip) in got for x in lives)

        if leak_wait_limit is None:
            done = self.wait(what, settled, budget)
        else:
            self.wait("nothing pending", lambda: self.probe.quiescent(candidates=True), budget)
            done = self.wait(what, settled, leak_wait_limit, expected=True)
        self.wait("nothing pending", lambda: self.probe.quiescent(candidates=True), budget)
        if self.cfg.leader:
            self.wait(
                "the leader to ack what it read", lambda: self.probe.leader_pending() in (0, None), budget
            )
        return done

    # -- the leaks' latencies and owners -----------------------------------------------------------------

    def _latencies(self, lives: list[Life], since_wall: float, grace: float) -> dict[str, Any]:
        decisions = self.probe.decisions(int(since_wall * 1000) - 1)
        decided, undecided = measure.decision_latencies(lives, decisions, grace)
        out: dict[str, Any] = {
            "leaks": len(lives),
            "grace_seconds": grace,
            "leak_to_decision_minus_grace": {**measure.percentiles(decided), "undecided": undecided},
        }
        if self.cfg.leader:
            released, unreleased = measure.release_latencies(lives, grace)
            out["leak_to_release_minus_grace"] = {**measure.percentiles(released), "unreleased": unreleased}
        return out

    def _node_ips(self, nodes: list[str]) -> dict[str, list[Life]]:
        """The live IP lifetimes of each node (its pods' and its tunnel's), before it is deleted."""
        return measure.node_ips(self.sim, nodes)

    def _affinities(self, nodes: list[str]) -> list[str]:
        items = self.server.store.list("blockaffinities", copy=False)["items"]
        return [a["metadata"]["name"] for a in items if (a.get("spec") or {}).get("node") in nodes]
