"""One benchmark mode, end to end: a simulated cluster, the real ipamgc processes, three measured phases.

Why a module of its own: this is the experiment itself, and its shape decides what the numbers mean.
The phases are here; the plumbing of the measured processes is `lab/bench/harness.py`, the readings
that bracket a phase and the waits that end it are `lab/bench/observe.py`.

Process layout (2 cores, loopback only):
- this process: the simulated cluster (`Store`, `SimCluster`, ground truth), its API server over real
  HTTP, the churn driver, and the probes.  Not measured: it stands in for Kubernetes and the kubelets;
- measured, each its own process: `redis-server`, the watcher (`python -m ipamgc.commands.watch`),
  `workers` × `python -m ipamgc.commands.work`, and the leader (`python -m ipamgc.commands.lead`).
  The modes differ only in two environment flags (`config.mode_env`, read back from each process's
  `/proc/<pid>/environ` into the result's `mode_flags`): `incremental` sets neither; `full-scan` sets
  `IPAMGC_FULL_SCAN=1` for the watcher (`Settings.full_scan`): every batch it publishes is followed by
  `Mirror.mark_all_dirty`, so every sync re-validates every allocation, as Calico 3.26 did; `per-node`
  sets `IPAMGC_PER_NODE=1` for the watcher and the workers (`Settings.per_node`): Calico 3.30–3.33's
  per-node dirty tracking, emulated by those components, never by this process.  Everything else, and
  the seeded workload, is identical between modes.

Phases, each bracketed by two `Reading`s (CPU per process, peak RSS reset at the start, Redis commands
minus the probe's own):
1. cold start: the watcher is started against an empty Redis (workers and leader already idle) and the
   phase ends once it has synced and every allocation has been validated (nothing dirty, leased, queued);
idle (optional): `idle_seconds` without events, the fixed cost per second;
backstop (optional, `backstop_passes`): the watcher's periodic pass on SIGUSR1, one at a time, each until
   its work has drained (`lab/bench/backstop.py`; kept in the result's `backstop`, not in `phases`);
2. churn: exactly `churn_rate × churn_seconds` `Churn` events, paced, then until everything is validated,
   every leak of the phase released (decided, without a leader) and the leader has acked all it read.
   In per-node mode a leak on a node no later event touches is confirmed only by the periodic full scan,
   by design: there the phase waits for nothing pending, then for the leaks at most
   `PER_NODE_LEAK_WAIT_MARGIN_SECONDS` beyond the grace period, and reports the rest as unreleased;
3. node loss: `node_loss` nodes (topped up to `node_loss_pods` pods beforehand, unmeasured) deleted with
   their pods at once, until every IP of theirs is released and their block affinities are gone.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from lab.bench import backend, backstop, conflicts, measure, nodechurn, sweep
from lab.bench.config import BenchConfig, mode_env
from lab.bench.harness import LEASE_NAMESPACE
from lab.bench.observe import Observing
from lab.bench.procs import Fleet, record_peak_rss
from lab.cluster.churn import ChurnStats
from lab.cluster.cluster import SimCluster
from lab.cluster.podshape import pod_size

# per-node mode, churn phase: how long beyond the grace period to wait for leaks once nothing is pending.
# Once the churn stops, a leak is confirmed only when its node is dirtied again (the release of a
# neighbouring leak does that: its allocation vanishes) or at the periodic full scan (`--resync-period`,
# 7m30s by default: past the end of the run, by design).  10 s is ample for such chains (a batch wait and
# a kick interval per link, the leader's 50 IPs/s); waiting longer would measure the run, not the mode.
PER_NODE_LEAK_WAIT_MARGIN_SECONDS = 10.0


# The longest wait for the cold start's shard jobs to end before the idle phase (they end `--job-idle`,
# 10 s by default, after their last work; a job lives at most 90 s).
IDLE_SETTLE_SECONDS = 60.0


class Timeout(Exception):
    """A wait of the benchmark ran out of time (the phase records it; the run goes on)."""


def leader_usable(python: str = sys.executable, cwd: Path | None = None) -> bool:
    """Whether `python -m ipamgc.commands.lead --help` works (the leader is usable in this tree)."""
    try:
        done = subprocess.run(
            [python, "-m", "ipamgc.commands.lead", "--help"],
            cwd=cwd,
            capture_output=True,
            timeout=120,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


class ModeRun(Observing):
    """Run one mode (`incremental`, `per-node` or `full-scan`); `run()` returns its JSON-ready result.

    The phases are here; the processes' plumbing is :class:`~lab.bench.harness.Harness`, the
    readings and the ends of phases :class:`~lab.bench.observe.Observing`."""

    # -- the run -----------------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        cfg = self.cfg

        def build(sim: SimCluster) -> None:
            sim.pod_size = pod_size(cfg.pod_size)
            sim.bootstrap(leak_grace_period=cfg.grace_duration())
            sim.bulk_populate(cfg.nodes, cfg.pods_per_node)
            self.result["pod_json_bytes_mean"] = backend.mean_pod_bytes(sim)

        try:
            with (
                backend.cluster(cfg.kube_apiserver, cfg.seed, build, self.workdir, cfg.pools()) as (
                    sim,
                    server,
                    built,
                ),
                Fleet(self.workdir, cwd=self.cwd) as fleet,
                self._redis(fleet),
            ):
                self.sim, self.server, self.fleet = sim, server, fleet
                allocations = len(sim.truth.in_use_ips())
                self.result["cluster"] = {
                    "nodes": cfg.nodes,
                    "pods": sim.pod_count(),
                    "allocations": allocations,
                    "simulator_load_seconds": round(built, 2),
                    "api_server": "kube-apiserver" if cfg.kube_apiserver else "simulated",
                }
                self.say(f"{self.mode}: {cfg.nodes} nodes, {sim.pod_count()} pods loaded")
                self._start_backend()
                self._cold_start(allocations)
                if cfg.idle_seconds:
                    self._idle()
                if cfg.backstop_passes:
                    backstop.ipamgc_passes(self)
                if cfg.churn_seconds:
                    sweep.churn_each_rate(self, self._churn)
                if cfg.conflicts_seconds:  # before the node churn: the same nodes as Calico's latency run
                    rest = lambda: self._caught_up("conflicts")  # noqa: E731
                    conflicts.run_phase(self, rest, self._cost, lambda: self.server.requests)
                if cfg.node_churn:
                    nodechurn.run_phase(self, lambda: self._caught_up("node-churn"), self._cost)
                if cfg.node_loss:
                    self._node_loss()
                self.result["redis_memory_end"] = self.probe.memory()
                record_peak_rss(self.result, fleet)
                self.result["watcher_stats"] = self._stop_watcher()
        except (RuntimeError, redis.RedisError) as exc:  # a component died: report what was measured
            self.result["error"] = str(exc)
            self.say(f"{self.mode}: failed: {exc}")
        finally:
            if hasattr(self, "sim"):
                self.result["violations"] = [vars(v) for v in self.sim.truth.violations]
                self.result["unexpected_frees"] = len(self.sim.truth.unexpected)
                del self.sim
            self.result["timeouts"] = self.timeouts
            gc.collect()
        return self.result

    # -- 1. cold start -----------------------------------------------------------------------------------

    def _cold_start(self, allocations: int) -> None:
        self.say(f"{self.mode}: cold start")
        start = self.start_phase()
        args = [*self._common("INFO"), "--kubeconfig", self._kubeconfig()]
        args += ["--lease-namespace", LEASE_NAMESPACE, "--kick-interval", f"{self.cfg.kick_interval}s"]
        args += ["--resync-period", f"{self.cfg.resync_period}s"]
        env = {**mode_env(self.mode, "watcher"), "IPAMGC_BATCH_WAIT": f"{self.cfg.batch_wait}s"}
        if self.mode == "combined":  # the workers and the leader too, in this one process
            args += ["--rate-limit", str(self.cfg.leader_rate_limit)]
            args += ["--name", f"bench-combined-{time.time_ns()}"]
            self.fleet.start_component("combined", "combined", "ipamgc.commands.combined", args, env)
        else:
            self.fleet.start_component("watcher", "watcher", "ipamgc.commands.watch", args, env)
        with self._profiled("cold-start"):
            self.wait("the watcher to sync", self.probe.synced)
            synced = time.monotonic() - start.monotonic
            self.wait(
                "every allocation to be validated",
                lambda: self.probe.quiescent() and self.probe.allocations() >= allocations,
            )
        end = self.reading()
        phase = measure.phase_cost(start, end, self.fleet, allocations)
        phase["api_requests"] = measure.api_requests(self.server.requests, start.wall, end.wall)
        phase["synced_seconds"] = round(synced, 3)
        phase["allocations"] = allocations
        phase["events_are"] = "allocations validated"
        self.result["phases"]["cold_start"] = phase
        self.result["mode_flags"] = self._mode_flags()
        self.say(f"  {phase['wall_seconds']} s, {phase['cpu_seconds']['total']} CPU s")

    # -- idle (between 1 and 2) --------------------------------------------------------------------------

    def _idle(self) -> None:
        self.say(f"{self.mode}: idle {self.cfg.idle_seconds} s")
        # The cold start's long-lived shard jobs linger for `--job-idle` (10 s) after draining, polling
        # for more work: that tail is the cold start's, not the fixed cost per second of a cluster with no
        # events, so the phase starts once they have ended (unmeasured, and said in the report).
        settle = time.monotonic()
        self.wait("the cold start's shard jobs to end", self.probe.jobs_done, IDLE_SETTLE_SECONDS)
        settled = time.monotonic() - settle
        start = self.start_phase()
        with self._profiled("idle"):
            time.sleep(self.cfg.idle_seconds)
        end = self.reading()
        phase = measure.phase_cost(start, end, self.fleet, 0)
        phase["api_requests"] = measure.api_requests(self.server.requests, start.wall, end.wall)
        wall = phase["wall_seconds"]
        phase["cpu_per_second"] = {role: round(v / wall, 4) for role, v in phase["cpu_seconds"].items()}
        phase["redis_commands_per_second"] = round(phase["redis_commands"] / wall, 1)
        phase["settled_seconds"] = round(settled, 3)
        self.result["phases"]["idle"] = phase

    # -- 2. churn ----------------------------------------------------------------------------------------

    def _churn(self) -> None:
        cfg = self.cfg
        self.say(f"{self.mode}: churn {cfg.churn_rate}/s for {cfg.churn_seconds} s")
        start = self.start_phase()
        with self._profiled("churn"):
            stats = self._drive_churn()
        stopped = time.monotonic()
        stopped_wall = time.time()
        self._caught_up("churn")
        validated = time.monotonic() - stopped
        lives = measure.lives_leaked_between(self.sim.truth, start.wall, stopped_wall)
        limit = None
        if self.mode == "per-node":
            limit = min(self.cfg.grace + PER_NODE_LEAK_WAIT_MARGIN_SECONDS, self.cfg.timeout)
        settled = self._settle(lives, start.wall, leak_wait_limit=limit)
        end = self.reading()
        phase = measure.phase_cost(start, end, self.fleet, stats.events)
        phase["api_requests"] = measure.api_requests(self.server.requests, start.wall, end.wall)
        if stats.events:
            phase["api_requests_per_event"] = round(phase["api_requests"]["total"] / stats.events, 3)
        phase.update(
            {
                "events_are": "pod events (creations, clean deletions, leaking deletions)",
                "created": stats.created,
                "deleted": stats.deleted,
                "leaked": stats.leaked,
                "errors": stats.errors,
                "churn_seconds": round(stopped - start.monotonic, 3),
                "achieved_rate": round(stats.events / max(stopped - start.monotonic, 1e-9), 1),
                "validated_after_seconds": round(validated, 3),
            }
        )
        phase.update(self._latencies(lives, start.wall, self.cfg.grace))
        if limit is not None:
            phase["leak_wait_limit_seconds"] = limit  # then the unreleased (undecided) are counted
            phase["leaks_all_settled"] = settled
        idle = self.result["phases"].get("idle")
        if idle is not None and stats.events:
            phase["net_of_idle"] = measure.net_of_idle(phase, idle)
        self.result["phases"]["churn"] = phase
        self.say(
            f"  {stats.events} events, {phase['cpu_seconds']['total']} CPU s, "
            f"{phase.get('cpu_per_event_us', {}).get('total')} µs/event"
        )

    def _drive_churn(self) -> ChurnStats:
        """The phase's seeded, paced events (`measure.drive_churn`)."""
        cfg = self.cfg
        return measure.drive_churn(self.sim, cfg.churn_rate, cfg.churn_seconds, cfg.leak_rate, cfg.seed)

    def _cost(self, start: measure.Reading, end: measure.Reading, events: int) -> dict[str, Any]:
        phase = measure.phase_cost(start, end, self.fleet, events)
        phase["api_requests"] = measure.api_requests(self.server.requests, start.wall, end.wall)
        return phase

    # -- 3. node loss ------------------------------------------------------------------------------------

    def _node_loss(self) -> None:
        cfg = self.cfg
        sim = self.sim
        victims = measure.prepare_node_loss(sim, cfg.node_loss, cfg.node_loss_pods)
        self.say(f"{self.mode}: node loss ({', '.join(victims)}), topped up to {cfg.node_loss_pods} pods")
        self._caught_up("node-loss")
        start = self.start_phase()
        owned = self._node_ips(victims)
        deleted_at: dict[str, float] = {}
        for node in victims:
            deleted_at[node] = time.time()
            sim.leak_node_deleted(node)
        deleting = time.time() - min(deleted_at.values())  # the simulator's own work (its API server waits)
        lives = [life for node in victims for life in owned[node]]
        self._settle(lives, start.wall)
        affinities_gone = None
        if cfg.leader and self.wait(
            "the lost nodes' affinities to go", lambda: not self._affinities(victims)
        ):
            affinities_gone = round(time.monotonic() - start.monotonic, 3)
        end = self.reading()
        ips = sum(len(lives) for lives in owned.values())
        phase = measure.phase_cost(start, end, self.fleet, ips)
        phase["api_requests"] = measure.api_requests(self.server.requests, start.wall, end.wall)
        phase["events_are"] = "IPs of the lost nodes"
        phase["nodes"] = victims
        phase["per_node"] = measure.node_cleanup(
            deleted_at, owned, self.probe.decisions(int(start.wall * 1000))
        )
        phase["affinities_gone_seconds"] = affinities_gone
        phase["simulator_delete_seconds"] = round(deleting, 3)
        phase.update(self._latencies(lives, start.wall, 0.0))
        self.result["phases"]["node_loss"] = phase
        self.say(f"  {ips} IPs on {len(victims)} nodes, {phase['wall_seconds']} s")


def run_mode(
    cfg: BenchConfig,
    mode: str,
    progress: Callable[[str], None],
    cwd: Path | None = None,
    profile_dir: Path | None = None,
) -> Any:
    """`ModeRun(...).run()` in a temporary directory (process logs, kubeconfig), removed afterwards."""
    with tempfile.TemporaryDirectory(prefix=f"ipamgc-bench-{mode}-") as tmp:
        return ModeRun(cfg, mode, Path(tmp), progress=progress, cwd=cwd, profile_dir=profile_dir).run()
