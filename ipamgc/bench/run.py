"""One benchmark mode, end to end: a simulated cluster, the real ipamgc processes, three measured phases.

Why a module of its own: this is the experiment itself, and its shape decides what the numbers mean.

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
2. churn: exactly `churn_rate × churn_seconds` `Churn` events, paced, then until everything is validated,
   every leak of the phase released (decided, without a leader) and the leader has acked all it read.
   In per-node mode a leak on a node no later event touches is confirmed only by the periodic full scan,
   by design: there the phase waits for nothing pending, then for the leaks at most
   `PER_NODE_LEAK_WAIT_MARGIN_SECONDS` beyond the grace period, and reports the rest as unreleased;
3. node loss: `node_loss` nodes (topped up to `node_loss_pods` pods beforehand, unmeasured) deleted with
   their pods at once, until every IP of theirs is released and their block affinities are gone.
"""

from __future__ import annotations

import contextlib
import gc
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import redis

from ipamgc.bench import measure
from ipamgc.bench.config import MODE_FLAGS, BenchConfig, mode_env
from ipamgc.bench.probe import Probe
from ipamgc.bench.procs import Fleet, free_port, process_env
from ipamgc.sim.apiserver import SimApiServer
from ipamgc.sim.churn import Churn, ChurnStats
from ipamgc.sim.cluster import SimCluster
from ipamgc.sim.store import SimApiError, Store
from ipamgc.sim.truth import Usage as Life
from shared.config import redis_client
from shared.model import allocation_id

POLL_SECONDS = 0.1
LEASE_NAMESPACE = "default"
LEADER_LEASE = "ipamgc-leader"
LEAK_WAIT_MARGIN_SECONDS = 60.0  # beyond the grace period, for the last leaks of a phase
# per-node mode, churn phase: how long beyond the grace period to wait for leaks once nothing is pending.
# Once the churn stops, a leak is confirmed only when its node is dirtied again (the release of a
# neighbouring leak does that: its allocation vanishes) or at the periodic full scan (`--resync-period`,
# 7m30s by default: past the end of the run, by design).  10 s is ample for such chains (a batch wait and
# a kick interval per link, the leader's 50 IPs/s); waiting longer would measure the run, not the mode.
PER_NODE_LEAK_WAIT_MARGIN_SECONDS = 10.0


# The longest wait for the cold start's shard jobs to end before the idle phase (they end `--job-idle`,
# 10 s by default, after their last work; a job lives at most 30 s).
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


class ModeRun:
    """Run one mode (`incremental`, `per-node` or `full-scan`); `run()` returns its JSON-ready result."""

    def __init__(
        self,
        cfg: BenchConfig,
        mode: str,
        workdir: Path,
        *,
        progress: Callable[[str], None] = lambda _: None,
        cwd: Path | None = None,
        profile_dir: Path | None = None,
    ) -> None:
        self.cfg = cfg
        self.profile_dir = profile_dir
        self.mode = mode
        self.workdir = workdir
        self.say = progress
        self.cwd = cwd
        self.timeouts: list[str] = []
        self.result: dict[str, Any] = {"mode": mode, "phases": {}}

    # -- waiting ------------------------------------------------------------------------------------------

    def wait(
        self, what: str, pred: Callable[[], bool], timeout: float | None = None, *, expected: bool = False
    ) -> bool:
        """Poll `pred` until true; False when `timeout` runs out (recorded in `timeouts`, unless that is
        `expected`: a bounded wait whose outcome the caller reports); raises when a process died."""
        deadline = time.monotonic() + (self.cfg.timeout if timeout is None else timeout)
        while not pred():
            dead = self.fleet.dead()
            if dead:
                tails = "\n".join(f"--- {p.name} exited {p.popen.returncode}:\n{p.tail()}" for p in dead)
                raise RuntimeError(f"{self.mode}: waiting for {what}: a process died\n{tails}")
            if time.monotonic() > deadline:
                if expected:
                    self.say(f"  stopped waiting for {what} after {timeout} s (expected in {self.mode})")
                    return False
                self.timeouts.append(what)
                self.say(f"  timed out waiting for {what}")
                return False
            time.sleep(POLL_SECONDS)
        return True

    def reading(self) -> measure.Reading:
        return measure.Reading(time.monotonic(), time.time(), self.fleet.usage(), self.probe.commands())

    def start_phase(self) -> measure.Reading:
        self.fleet.reset_peaks()
        return self.reading()

    # -- the run ------------------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        t0 = time.monotonic()
        store = Store(seed=cfg.seed)
        self.sim = SimCluster(store, seed=cfg.seed)
        self.sim.bootstrap(leak_grace_period=cfg.grace_duration())
        self.sim.bulk_populate(cfg.nodes, cfg.pods_per_node)
        allocations = len(self.sim.truth.in_use_ips())
        self.result["cluster"] = {
            "nodes": cfg.nodes,
            "pods": self.sim.pod_count(),
            "allocations": allocations,
            "simulator_load_seconds": round(time.monotonic() - t0, 2),
        }
        self.say(f"{self.mode}: {cfg.nodes} nodes, {self.sim.pod_count()} pods loaded")
        try:
            with (
                SimApiServer(store) as server,
                Fleet(self.workdir, cwd=self.cwd) as fleet,
                self._redis(fleet),
            ):
                self.server, self.fleet = server, fleet
                self._start_backend()
                self._cold_start(allocations)
                if cfg.idle_seconds:
                    self._idle()
                self._churn()
                if cfg.node_loss:
                    self._node_loss()
                self.result["redis_memory_end"] = self.probe.memory()
                self.result["watcher_stats"] = self._stop_watcher()
        except (RuntimeError, redis.RedisError) as exc:  # a component died: report what was measured
            self.result["error"] = str(exc)
            self.say(f"{self.mode}: failed: {exc}")
        finally:
            self.result["violations"] = [vars(v) for v in self.sim.truth.violations]
            self.result["unexpected_frees"] = len(self.sim.truth.unexpected)
            self.result["timeouts"] = self.timeouts
            del self.sim
            gc.collect()
        return self.result

    @contextlib.contextmanager
    def _redis(self, fleet: Fleet) -> Iterator[redis.Redis]:
        port = free_port()
        fleet.start_redis(port)
        self.url = f"redis://127.0.0.1:{port}/0"
        client = redis_client(self.url)
        try:
            self.fleet = fleet
            self.probe = Probe(client, shards=self.cfg.shards)
            if not self.wait("redis-server to answer", self.probe.ping, 30):
                raise RuntimeError("redis-server did not start")
            yield client
        finally:
            client.close()

    def _common(self, level: str = "WARNING") -> list[str]:
        return [
            *("--redis-url", self.url, "--shards-count", str(self.cfg.shards)),
            *("--log-level", level, "--log-format", "json"),
        ]

    def _kubeconfig(self) -> str:
        return str(self.server.write_kubeconfig(self.workdir / "kubeconfig"))

    def _start_backend(self) -> None:
        """Workers and the leader, started before the measurement: they wait (gated) for the watcher."""
        cfg = self.cfg
        for i in range(cfg.workers):
            args = [*self._common(), "--name", f"bench-{self.mode}-{i}-{time.time_ns()}"]
            env = mode_env(self.mode, "workers")
            self.fleet.start_component(f"worker-{i}", "workers", "ipamgc.commands.work", args, env)
        if cfg.leader:
            args = [*self._common(), "--kubeconfig", self._kubeconfig(), "--lease-namespace", LEASE_NAMESPACE]
            args += ["--lease-name", LEADER_LEASE, "--rate-limit", str(cfg.leader_rate_limit)]
            env = mode_env(self.mode, "leader")
            self.fleet.start_component("leader", "leader", "ipamgc.commands.lead", args, env)
        self.wait("the workers to register", lambda: self.probe.workers() >= cfg.workers, 120)
        if cfg.leader:
            self.wait("the leader to hold its Lease", self._leader_elected, 120)
        time.sleep(1.0)  # let their start-up CPU settle before the first reading

    def _leader_elected(self) -> bool:
        try:
            lease = self.server.store.get("leases", LEASE_NAMESPACE, LEADER_LEASE)
        except SimApiError:  # 404: not created yet
            return False
        return bool((lease.get("spec") or {}).get("holderIdentity"))

    # -- 1. cold start ---------------------------------------------------------------------------------------

    def _cold_start(self, allocations: int) -> None:
        self.say(f"{self.mode}: cold start")
        start = self.start_phase()
        args = [*self._common("INFO"), "--kubeconfig", self._kubeconfig()]
        args += ["--election-namespace", LEASE_NAMESPACE, "--kick-interval", f"{self.cfg.kick_interval}s"]
        args += ["--resync-period", f"{self.cfg.resync_period}s"]
        env = {**mode_env(self.mode, "watcher"), "IPAMGC_BATCH_WAIT": f"{self.cfg.batch_wait}s"}
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
        phase["synced_seconds"] = round(synced, 3)
        phase["allocations"] = allocations
        phase["events_are"] = "allocations validated"
        self.result["phases"]["cold_start"] = phase
        self.result["mode_flags"] = self._mode_flags()
        self.say(f"  {phase['wall_seconds']} s, {phase['cpu_seconds']['total']} CPU s")

    def _mode_flags(self) -> dict[str, dict[str, str | None]]:
        """The mode flags each ipamgc process really runs with, read back from the kernel (every process
        has long exec'd by the end of the cold start)."""
        out: dict[str, dict[str, str | None]] = {}
        for p in self.fleet:
            if p.role != "redis":
                env = process_env(p.pid)
                out[p.name] = {flag: env.get(flag) for flag in MODE_FLAGS}
        return out

    # -- idle (between 1 and 2) -----------------------------------------------------------------------------

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
        wall = phase["wall_seconds"]
        phase["cpu_per_second"] = {role: round(v / wall, 4) for role, v in phase["cpu_seconds"].items()}
        phase["redis_commands_per_second"] = round(phase["redis_commands"] / wall, 1)
        phase["settled_seconds"] = round(settled, 3)
        self.result["phases"]["idle"] = phase

    # -- 2. churn --------------------------------------------------------------------------------------------

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

    @contextlib.contextmanager
    def _profiled(self, phase: str) -> Iterator[None]:
        """With `profile_dir`: sample every ipamgc process with py-spy (GIL holders only, raw collapsed
        stacks) until the phase ends.  An investigation aid: the sampling slows the processes it samples."""
        if self.profile_dir is None:
            yield
            return
        beside = Path(sys.executable).with_name("py-spy")
        spy_binary = shutil.which("py-spy") or (str(beside) if beside.exists() else None)
        if spy_binary is None:
            self.say("  --profile: py-spy is not installed, not profiling")
            yield
            return
        spies = []
        for p in self.fleet:
            if p.role == "redis":
                continue
            out = self.profile_dir / f"{self.mode}-{phase}-{p.name}.txt"
            args = [spy_binary, "record", "--gil", "--pid", str(p.pid), "--rate", "1000", "--format", "raw"]
            args += ["--output", str(out)]
            spies.append(subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        try:
            yield
        finally:
            for spy in spies:  # py-spy writes its samples when interrupted
                spy.send_signal(signal.SIGINT)
            deadline = time.monotonic() + 30  # one still attaching may miss the signal: then killed
            for spy in spies:
                try:
                    spy.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    spy.kill()
                    spy.wait()

    def _drive_churn(self) -> ChurnStats:
        """Exactly `churn_rate × churn_seconds` events, paced at `churn_rate`: both modes get the same
        seeded sequence of events even if one of them slows the simulator down."""
        cfg = self.cfg
        churn = Churn(self.sim, cfg.churn_rate, cfg.leak_rate, seed=cfg.seed)
        start = time.monotonic()
        for i in range(round(cfg.churn_rate * cfg.churn_seconds)):
            churn.step()
            delay = start + (i + 1) / cfg.churn_rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        return churn.stats

    def _caught_up(self, tag: str) -> None:
        """A sentinel pod created last: once it and its allocation are mirrored and nothing is dirty, the
        watcher has applied every earlier event of both watches and the workers have validated them."""
        node = sorted(self.sim.node_names)[0]
        name = f"sentinel-{tag}"
        ips = self.sim.create_pod("bench", name, node)
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

    # -- 3. node loss ----------------------------------------------------------------------------------------

    def _node_loss(self) -> None:
        cfg = self.cfg
        sim = self.sim
        victims = sorted(sim.rng.sample(sorted(sim.node_names), cfg.node_loss))
        self.say(f"{self.mode}: node loss ({', '.join(victims)}), topped up to {cfg.node_loss_pods} pods")
        for node in victims:
            have = sum(1 for n in sim.pod_nodes.values() if n == node)
            for i in range(max(0, cfg.node_loss_pods - have)):
                sim.create_pod("bench", f"{node}-extra-{i}", node)
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

    def _node_ips(self, nodes: list[str]) -> dict[str, list[Life]]:
        """The live IP lifetimes of each node (its pods' and its tunnel's), before it is deleted."""
        truth = self.sim.truth
        owners = {f"tunnel:{n}": n for n in nodes}
        owners.update({f"{ns}/{pod}": n for (ns, pod), n in self.sim.pod_nodes.items() if n in nodes})
        out: dict[str, list[Life]] = {n: [] for n in nodes}
        with truth._lock:
            for lives in truth.usages.values():
                life = lives[-1]
                if life.freed_at is None and life.in_use_until is None and life.owner in owners:
                    out[owners[life.owner]].append(life)
        return out

    def _affinities(self, nodes: list[str]) -> list[str]:
        items = self.server.store.list("blockaffinities", copy=False)["items"]
        return [a["metadata"]["name"] for a in items if (a.get("spec") or {}).get("node") in nodes]

    # -- the end ---------------------------------------------------------------------------------------------

    def _stop_watcher(self) -> dict[str, Any]:
        """Stop the watcher and read the counters it logs on the way out."""
        (watcher,) = self.fleet.by_role("watcher")
        self.fleet.stop(watcher)
        stats: dict[str, Any] = {}
        for line in watcher.log.read_bytes().splitlines():
            with contextlib.suppress(orjson.JSONDecodeError):
                rec = orjson.loads(line)
                if isinstance(rec, dict) and rec.get("message") == "stopped publishing":
                    stats = rec.get("stats") or {}
        return stats


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
