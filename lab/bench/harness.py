"""The plumbing around one benchmark mode's measured processes, apart from the experiment itself.

Why a module of its own: a mode (`lab.bench.run.ModeRun`) is three measured phases, and what they
mean should read without the process handling in between.  Everything that starts, watches and stops
the real ipamgc processes lives here in :class:`Harness`, which `ModeRun` extends: `redis-server` up
and answering, the workers and the leader started with the mode's environment flags (and the flags read
back from the kernel), the polling waits that give up when a process dies, the py-spy profiling of a
phase, and the watcher's counters read from its log on the way out.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import redis

from ipamgc import childproc
from lab.apiserver.store import SimApiError
from lab.bench.backend import Server
from lab.bench.config import MODE_FLAGS, BenchConfig, mode_env
from lab.bench.probe import Probe
from lab.bench.procs import Fleet, free_port, process_env
from redisio.client import redis_client

__all__ = ["LEADER_LEASE", "LEASE_NAMESPACE", "POLL_SECONDS", "Harness"]

POLL_SECONDS = 0.1
LEASE_NAMESPACE = "default"
LEADER_LEASE = "ipamgc-leader"


class Harness:
    """One mode's processes: Redis, the workers, the leader and the watcher, started, awaited, stopped."""

    server: Server  # the API server the processes talk to, simulated or real (set by the run)
    fleet: Fleet
    probe: Probe
    url: str  # the Redis URL

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

    # -- waiting -----------------------------------------------------------------------------------------

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

    # -- the processes -----------------------------------------------------------------------------------

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
            *("--redis-url", self.url, "--shard-count", str(self.cfg.shards)),
            *("--log-level", level, "--log-format", "json"),
        ]

    def _kubeconfig(self) -> str:
        return str(self.server.write_kubeconfig(self.workdir / "kubeconfig"))

    def _start_backend(self) -> None:
        """Workers and the leader, started before the measurement: they wait (gated) for the watcher.
        None in `combined`: they start with it, in its process, inside the cold start."""
        cfg = self.cfg
        if self.mode == "combined":
            return
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

    def _mode_flags(self) -> dict[str, dict[str, str | None]]:
        """The mode flags each ipamgc process really runs with, read back from the kernel (every process
        has long exec'd by the end of the cold start)."""
        out: dict[str, dict[str, str | None]] = {}
        for p in self.fleet:
            if p.role != "redis":
                env = process_env(p.pid)
                out[p.name] = {flag: env.get(flag) for flag in MODE_FLAGS}
        return out

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
            spies.append(childproc.popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
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

    def _stop_watcher(self) -> dict[str, Any]:
        """Stop the watcher and read the counters it logs on the way out."""
        (watcher,) = self.fleet.watchers()
        self.fleet.stop(watcher)
        stats: dict[str, Any] = {}
        for line in watcher.log.read_bytes().splitlines():
            with contextlib.suppress(orjson.JSONDecodeError):
                rec = orjson.loads(line)
                if isinstance(rec, dict) and rec.get("message") == "stopped publishing":
                    stats = rec.get("stats") or {}
        return stats
