"""`ipamgc bench --mode calico`: Calico's own kube-controllers on the same seeded workload as ipamgc.

Why a module of its own: the other modes measure ipamgc's processes (or ipamgc's emulations of Calico's
algorithms); this one measures the real Go binary an operator runs (`lab/kubecontrollers.py` says how
it is run), against the same simulated cluster, with the same readings: its process CPU from the kernel
(`procs.cpu_sample`, as for ipamgc's processes), its peak RSS, the API requests it made (the simulated API
server's request log: nothing else talks to the server in this mode), and the ground truth of every IP.

Fairness, the part of the measurement that decides what it means:
- Calico's full scan runs every grace / 2, and its grace cannot be set apart from that period.  At the
  benchmark's 2 s grace Calico would scan everything every second, and its churn would measure its scans,
  not its handling of events.  So the **cost run** is at the production default (`calico_grace`, 15 min):
  no periodic full scan falls inside the phases (the first comes 7.5 min after the start), and the churn
  phase ends when Calico has logged every leak of the phase as a *candidate* (it cannot release one
  within 15 minutes).  ipamgc's incremental mode runs with its periodic resync outside the run too
  (`resync_period`, 450 s by default), so neither side's full scan is inside the churn.  ipamgc's churn
  also releases the phase's leaks (its grace is 2 s); Calico's at 15 min does not: that work is on
  ipamgc's side of the ratio, not Calico's.
- The **latency run** (`lab/bench/calico_latency.py`), at the short grace: leak → release latency and
  the conflicts phase; its CPU apart (`churn_short_grace`), a full scan every grace / 2 in it.
- The **backstop run** (`--backstop-passes N`, `lab/bench/backstop.py`), at `calico_backstop_grace`
  with no events: one window per full scan of its ticker, net of the cost run's idle rate.
- Phases end on what Calico itself logs at `info` (in sync, candidate) and on the ground truth (released,
  affinities gone), then on the process going quiet: no probe talks to it.
"""

from __future__ import annotations

import contextlib
import gc
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from lab.bench import backend, measure, nodechurn, sweep
from lab.bench.backend import Server
from lab.bench.config import BenchConfig
from lab.bench.probe import Commands
from lab.bench.procs import Fleet, Proc, cpu_delta, cpu_sample, free_port, record_peak_rss
from lab.cluster.churn import ChurnStats
from lab.cluster.cluster import SimCluster
from lab.cluster.podshape import pod_size
from lab.kubecontrollers import Binary, CalicoLog, environment, go_cpu_profile, kcc_spec

__all__ = ["ROLE", "CalicoRun", "run_calico"]

ROLE = "kube-controllers"  # the one measured process's role in the report
POLL_SECONDS = 0.1
# "Quiet": the binary ran less than QUIET_CPU_SECONDS of CPU over the last QUIET_WINDOW_SECONDS.  2 % of a
# core: Calico idles at well under 1 % (a Lease-less single process with a few watches).
QUIET_WINDOW_SECONDS = 1.0
QUIET_CPU_SECONDS = 0.02


def _go_duration(seconds: float) -> str:
    return f"{round(seconds * 1000)}ms"


class CalicoRun:
    """One binary, two starts on the same seeded cluster: the cost run and the latency run."""

    def __init__(
        self,
        cfg: BenchConfig,
        binary: Binary,
        workdir: Path,
        *,
        progress: Callable[[str], None] = lambda _: None,
        profile_dir: Path | None = None,
        backstop: Callable[[CalicoRun], None] | None = None,
        latency: Callable[[CalicoRun], None] | None = None,
    ) -> None:
        self.cfg = cfg
        # The latency run (`lab.bench.calico_latency.latency_run`), given by the caller as the backstop
        # run is: that module reads this one's runs.
        self._latency = latency
        # The backstop run (`lab.bench.backstop.calico_passes`), given by the caller: that module
        # reads this one's runs, so this one does not import it.
        self._backstop = backstop
        self.binary = binary
        self.mode = binary.mode
        self.workdir = workdir
        self.say = progress
        self.profile_dir = profile_dir
        self.timeouts: list[str] = []
        self.restarts = 0
        self.result: dict[str, Any] = {
            "mode": self.mode,
            "binary": {"name": binary.name, "path": str(binary.path)},
            "phases": {},
            "runs": {
                "cost": {
                    "grace_seconds": cfg.calico_grace,
                    "phases": ["cold_start", "idle", "churn", "node_loss"],
                },
                "latency": {"grace_seconds": cfg.grace, "phases": ["churn_short_grace"]},
            },
            "fairness": (
                f"CPU from the cost run (grace {cfg.calico_grace:g} s: Calico's periodic full scan, every "
                "grace / 2, falls outside it; its churn ends when every leak is a logged candidate); leak "
                f"latency from the latency run (grace {cfg.grace:g} s, a full scan every grace / 2)"
            ),
        }
        self.violations: list[dict[str, Any]] = []
        self.unexpected = 0

    # -- the run -----------------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        try:
            self._cost_run()
            short_grace = self.cfg.churn_seconds or self.cfg.conflicts_seconds  # the latency run's phases
            if short_grace and self._latency is not None:
                self._latency(self)
            if self.cfg.backstop_passes and self._backstop is not None:
                self._backstop(self)
        except (RuntimeError, OSError) as exc:
            self.result["error"] = str(exc)
            self.say(f"{self.mode}: failed: {exc}")
        self.result["violations"] = self.violations
        self.result["unexpected_frees"] = self.unexpected
        self.result["timeouts"] = self.timeouts
        self.result["restarts"] = self.restarts
        return self.result

    @contextlib.contextmanager
    def cluster(self, grace: float, tag: str) -> Iterator[tuple[SimCluster, Server, Fleet]]:
        cfg = self.cfg
        self.pprof_port = free_port() if self.profile_dir is not None else None

        def build(sim: SimCluster) -> None:
            sim.pod_size = pod_size(cfg.pod_size)
            sim.bootstrap(leak_grace_period=_go_duration(grace))
            sim.bulk_populate(cfg.nodes, cfg.pods_per_node)
            kcc = sim.store.get("kubecontrollersconfigurations", None, "default")
            kcc["spec"] = kcc_spec(_go_duration(grace), self.pprof_port)
            sim.store.replace("kubecontrollersconfigurations", None, "default", kcc)

        sim: SimCluster | None = None
        try:
            with (
                backend.cluster(cfg.kube_apiserver, cfg.seed, build, self.workdir, cfg.pools()) as (
                    sim,
                    server,
                    built,
                ),
                Fleet(self.workdir) as fleet,
            ):
                if "cluster" not in self.result:
                    self.result["cluster"] = {
                        "nodes": cfg.nodes,
                        "pods": sim.pod_count(),
                        "allocations": len(sim.truth.in_use_ips()),
                        "simulator_load_seconds": round(built, 2),
                        "api_server": "kube-apiserver" if cfg.kube_apiserver else "simulated",
                    }
                self.say(
                    f"{self.mode} ({tag} run, grace {grace:g} s): {cfg.nodes} nodes, "
                    f"{sim.pod_count()} pods loaded"
                )
                self.sim, self.server, self.fleet = sim, server, fleet
                yield sim, server, fleet
                record_peak_rss(self.result, fleet)  # a run that failed adds nothing
        finally:
            if sim is not None:
                self.violations += [vars(v) for v in sim.truth.violations]
                self.unexpected += len(sim.truth.unexpected)
            if hasattr(self, "sim"):
                del self.sim
            gc.collect()

    def start(self, tag: str) -> Proc:
        kubeconfig = self.server.write_kubeconfig(self.workdir / f"kubeconfig-{tag}")
        proc = self.fleet.start(
            f"kube-controllers-{tag}", ROLE, [str(self.binary.path)], environment(kubeconfig)
        )
        self.log = CalicoLog(proc.log)
        return proc

    # -- waiting -----------------------------------------------------------------------------------------

    def wait(self, what: str, pred: Callable[[], bool], timeout: float | None = None) -> bool:
        deadline = time.monotonic() + (self.cfg.timeout if timeout is None else timeout)
        while not pred():
            self._check_alive(what)
            if time.monotonic() > deadline:
                self.timeouts.append(what)
                self.say(f"  timed out waiting for {what}")
                return False
            time.sleep(POLL_SECONDS)
        return True

    def _check_alive(self, what: str) -> None:
        for p in self.fleet.dead():
            restarting = self.log.count("restarting") > self.restarts
            if not restarting:
                raise RuntimeError(
                    f"{self.mode}: waiting for {what}: kube-controllers exited {p.popen.returncode}\n"
                    + p.tail()
                )
            # 3.26 exits once on a configuration it rewrote ("configuration changed; restarting"); the
            # kubelet would start it again, and so does the benchmark (counted in `restarts`).
            self.restarts += 1
            self.fleet.procs.remove(p)
            self.say(f"  kube-controllers restarted itself ({p.tail(1).strip()[-60:]}): started again")
            self.start(f"{p.name.rsplit('-', 1)[-1]}{self.restarts}")

    def _proc(self) -> Proc:
        return self.fleet.by_role(ROLE)[-1]

    def quiet(self) -> bool:
        """The binary ran less than QUIET_CPU_SECONDS over the last QUIET_WINDOW_SECONDS."""
        proc = self._proc()
        first = cpu_sample(proc.pid)
        time.sleep(QUIET_WINDOW_SECONDS)
        used, _ = cpu_delta(first, cpu_sample(proc.pid))
        return used < QUIET_CPU_SECONDS

    # -- readings ----------------------------------------------------------------------------------------

    def reading(self) -> measure.Reading:
        return measure.Reading(time.monotonic(), time.time(), self.fleet.usage(), Commands({}), {})

    def start_phase(self) -> measure.Reading:
        self.fleet.reset_peaks()
        return self.reading()

    def phase(self, start: measure.Reading, end: measure.Reading, events: int) -> dict[str, Any]:
        out = measure.phase_cost(start, end, self.fleet, events)
        out["api_requests"] = measure.api_requests(self.server.requests, start.wall, end.wall)
        if events and out["api_requests"]["total"]:
            out["api_requests_per_event"] = round(out["api_requests"]["total"] / events, 3)
        return out

    @contextlib.contextmanager
    def _profiled(self, phase: str, seconds: float) -> Iterator[None]:
        """With `profile_dir`: Go's CPU profile of the binary over the phase (its KCC `debugProfilePort`)."""
        if self.profile_dir is None or self.pprof_port is None:
            yield
            return
        with go_cpu_profile(self.pprof_port, self.profile_dir / f"{self.mode}-{phase}.pprof", seconds):
            yield

    # -- the cost run: cold start, idle, churn, node loss at the production grace ------------------------

    def _cost_run(self) -> None:
        cfg = self.cfg
        with self.cluster(cfg.calico_grace, "cost"):
            allocations = self.result["cluster"]["allocations"]
            self.say(f"{self.mode}: cold start")
            start = self.start_phase()
            self.start("cost")
            self.wait("Calico's syncer to be in sync", lambda: self.log.count("in-sync") > 0)
            synced = time.monotonic() - start.monotonic
            self.wait("kube-controllers to go quiet after its first sync", self.quiet)
            end = self.reading()
            phase = self.phase(start, end, allocations)
            phase.update(
                synced_seconds=round(synced, 3),
                allocations=allocations,
                events_are="allocations validated",
                ends_when=f"in sync, then < {QUIET_CPU_SECONDS * 1000:g} ms CPU in {QUIET_WINDOW_SECONDS:g}s",
            )
            self.result["phases"]["cold_start"] = phase
            self.say(f"  {phase['wall_seconds']} s, {phase['cpu_seconds']['total']} CPU s")
            if cfg.idle_seconds:
                self._idle()
            if cfg.churn_seconds:
                sweep.churn_each_rate(self, self._churn_candidates)
            if cfg.node_churn:
                nodechurn.run_phase(self, self._at_rest("node-churn"), self.phase)
            if cfg.node_loss:
                self._node_loss()

    def _idle(self) -> None:
        self.say(f"{self.mode}: idle {self.cfg.idle_seconds} s")
        start = self.start_phase()
        time.sleep(self.cfg.idle_seconds)
        end = self.reading()
        phase = self.phase(start, end, 0)
        wall = phase["wall_seconds"]
        phase["cpu_per_second"] = {role: round(v / wall, 4) for role, v in phase["cpu_seconds"].items()}
        phase["redis_commands_per_second"] = 0.0
        self.result["phases"]["idle"] = phase

    def drive_churn(self) -> ChurnStats:
        """The same seeded, paced events as every other mode (`measure.drive_churn`)."""
        cfg = self.cfg
        return measure.drive_churn(self.sim, cfg.churn_rate, cfg.churn_seconds, cfg.leak_rate, cfg.seed)

    def _churn_candidates(self) -> None:
        cfg = self.cfg
        self.say(
            f"{self.mode}: churn {cfg.churn_rate}/s for {cfg.churn_seconds} s (grace {cfg.calico_grace:g} s)"
        )
        self.log.poll()
        start = self.start_phase()
        with self._profiled("churn", cfg.churn_seconds):
            stats = self.drive_churn()
        stopped = time.monotonic()
        lives = measure.lives_leaked_between(self.sim.truth, start.wall, time.time())
        leaked = {life.ip for life in lives}
        self.wait(
            "every leak of the phase to be a logged candidate", lambda: leaked <= self.log.ips("candidate")
        )
        self._at_rest("churn")()
        end = self.reading()
        phase = self.phase(start, end, stats.events)
        phase.update(
            {
                "events_are": "pod events (creations, clean deletions, leaking deletions)",
                "created": stats.created,
                "deleted": stats.deleted,
                "leaked": stats.leaked,
                "errors": stats.errors,
                "churn_seconds": round(stopped - start.monotonic, 3),
                "achieved_rate": round(stats.events / max(stopped - start.monotonic, 1e-9), 1),
                "validated_after_seconds": round(end.monotonic - stopped - QUIET_WINDOW_SECONDS, 3),
                "leaks": len(lives),
                "candidates_logged": len(leaked & self.log.ips("candidate")),
                "grace_seconds": cfg.calico_grace,
                "ends_when": "every leak a logged candidate, then quiet",
            }
        )
        idle = self.result["phases"].get("idle")
        if idle is not None and stats.events:
            phase["net_of_idle"] = measure.net_of_idle(phase, idle)
        self.result["phases"]["churn"] = phase
        self.say(
            f"  {stats.events} events, {phase['cpu_seconds']['total']} CPU s, "
            f"{phase.get('cpu_per_event_us', {}).get('total')} µs/event, "
            f"{phase['candidates_logged']}/{len(lives)} leaks candidates"
        )

    def _at_rest(self, tag: str) -> Callable[[], None]:
        """Creates the pod `ModeRun._caught_up` creates at the same point (so that the simulator's random
        stream, and every later event, is the same as in the other modes), then waits for quiet."""

        def rest() -> None:
            measure.create_sentinel(self.sim, tag)
            self.wait(f"kube-controllers to go quiet ({tag})", self.quiet)

        return rest

    def _node_loss(self) -> None:
        cfg, sim = self.cfg, self.sim
        victims = measure.prepare_node_loss(sim, cfg.node_loss, cfg.node_loss_pods)
        self.say(f"{self.mode}: node loss ({', '.join(victims)}), topped up to {cfg.node_loss_pods} pods")
        self._at_rest("node-loss")()
        start = self.start_phase()
        owned = measure.node_ips(sim, victims)
        deleted_at: dict[str, float] = {}
        for node in victims:
            deleted_at[node] = time.time()
            sim.leak_node_deleted(node)
        lives = [life for node in victims for life in owned[node]]
        self.wait("the lost nodes' IPs to be released", lambda: all(x.freed_at is not None for x in lives))
        affinities_gone = None
        if self.wait("the lost nodes' affinities to go", lambda: not self._affinities(victims)):
            affinities_gone = round(time.monotonic() - start.monotonic, 3)
        end = self.reading()
        ips = len(lives)
        phase = self.phase(start, end, ips)
        phase["events_are"] = "IPs of the lost nodes"
        phase["nodes"] = victims
        phase["per_node"] = measure.node_cleanup(deleted_at, owned, [])
        phase["affinities_gone_seconds"] = affinities_gone
        released, unreleased = measure.release_latencies(lives, 0.0)
        phase["leak_to_release_minus_grace"] = {**measure.percentiles(released), "unreleased": unreleased}
        self.result["phases"]["node_loss"] = phase
        self.say(f"  {ips} IPs on {len(victims)} nodes, {phase['wall_seconds']} s")

    def _affinities(self, nodes: list[str]) -> list[str]:
        items = self.server.store.list("blockaffinities", copy=False)["items"]
        return [a["metadata"]["name"] for a in items if (a.get("spec") or {}).get("node") in nodes]


def run_calico(
    cfg: BenchConfig,
    binary: Binary,
    progress: Callable[[str], None],
    profile_dir: Path | None = None,
    backstop: Callable[[CalicoRun], None] | None = None,
    latency: Callable[[CalicoRun], None] | None = None,
) -> dict[str, Any]:
    """`CalicoRun(...).run()` in a temporary directory (the binary's logs, kubeconfigs), removed after;
    `backstop`: its backstop run (`--backstop-passes`)."""
    with tempfile.TemporaryDirectory(prefix=f"ipamgc-bench-{binary.mode}-") as tmp:
        run = CalicoRun(
            cfg,
            binary,
            Path(tmp),
            progress=progress,
            profile_dir=profile_dir,
            backstop=backstop,
            latency=latency,
        )
        return run.run()
