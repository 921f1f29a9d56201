"""The two collectors, each run on its own sandboxed cluster until quiet: Calico's kube-controllers, and
ipamgc's real components.

Why a module of its own: "until quiet" decides what a comparison can see, so it is defined once for both.
A run is *ready* when its collector says it has synced (Calico logs `Syncer is InSync`; ipamgc's watcher
marks its state synced in Redis), and *quiet* once no IPAM object (block, affinity, handle) has been
written for `quiet_window(grace)` seconds after the later of that moment and the last such write: a grace
period, plus Calico's full-scan period (grace / 2; ipamgc's default resync period is the same), plus a
margin.  Every stage of a collection (a candidate confirmed, then its block found empty, then that block
released) follows a write or the sync within that window, so a run that stays quiet that long is done.
A run that never gets quiet is stopped at `deadline` and says so (`Outcome.quiet` False).

The processes are started as `ipamgc bench` starts them (`lab.bench.procs.Fleet`): Calico's binary with
`lab.kubecontrollers.environment`; for ipamgc `redis-server`, one worker, the leader and the watcher,
each `python -m ipamgc.commands.<component>`, their logs in the run's directory.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from lab.apiserver.store import SimApiError
from lab.bench.config import mode_env
from lab.bench.probe import Probe
from lab.bench.procs import Fleet, free_port
from lab.compare.recorder import Outcome
from lab.compare.sandbox import Sandbox
from lab.kubecontrollers import CalicoLog, environment
from redisio.client import redis_client

__all__ = ["POLL_SECONDS", "deadline_for", "quiet_window", "run_calico", "run_ipamgc"]

POLL_SECONDS = 0.1
MARGIN_SECONDS = 3.0
LEASE_NAMESPACE = "default"
LEADER_LEASE = "ipamgc-leader"


# ipamgc's leader looks at empty blocks and cooling IPs once a pass (`cleanup_interval_seconds`,
# 5 s): an empty block goes after two of its passes more than the grace period apart, so after the write that
# emptied it the release can take a grace period and two passes.
LEADER_PASS_SECONDS = 5.0


def quiet_window(grace: float) -> float:
    """Seconds without an IPAM write after which a run is done: the longer of Calico's stage (its full scan
    every grace / 2) and ipamgc's (two leader passes), after a grace period, plus a margin."""
    return grace + max(grace / 2, 2 * LEADER_PASS_SECONDS) + MARGIN_SECONDS


def deadline_for(grace: float) -> float:
    """The longest a run may take: start-up, a few collection stages, the quiet window."""
    return 120.0 + 6 * grace


class ProcessDied(RuntimeError):
    """A collector process exited during its run."""


def _poll_until(what: str, pred: Callable[[], bool], fleet: Fleet, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        dead = fleet.dead()
        if dead:
            tails = "\n".join(f"--- {p.name} exited {p.popen.returncode}:\n{p.tail()}" for p in dead)
            raise ProcessDied(f"waiting for {what}: a process died\n{tails}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(POLL_SECONDS)


def _until_quiet(
    sb: Sandbox, fleet: Fleet, ready: Callable[[], bool], grace: float, deadline: float
) -> Outcome:
    """Poll until quiet (or the deadline); fills the run's `Outcome`."""
    rec = sb.recorder
    window = quiet_window(grace)
    ready_at: float | None = None
    end = time.monotonic() + deadline
    while True:
        dead = fleet.dead()
        if dead:
            tails = "\n".join(f"--- {p.name} exited {p.popen.returncode}:\n{p.tail()}" for p in dead)
            rec.outcome.error = f"a process died\n{tails}"
            break
        if ready_at is None and ready():
            ready_at = time.monotonic()
            rec.outcome.ready = rec.now()
        if ready_at is not None and min(rec.quiet_for(), time.monotonic() - ready_at) >= window:
            rec.outcome.quiet = True
            break
        if time.monotonic() > end:
            rec.outcome.error = "not ready before the deadline" if ready_at is None else ""
            break
        time.sleep(POLL_SECONDS)
    rec.outcome.ended = rec.now()
    return rec.outcome


def run_calico(sb: Sandbox, binary: Path, workdir: Path, grace: float, deadline: float) -> Outcome:
    """Calico's kube-controllers (the node controller alone) on `sb` until quiet."""
    with Fleet(workdir) as fleet:
        sb.recorder.restart()
        proc = fleet.start("calico-kube-controllers", "calico", [str(binary)], environment(sb.kubeconfig))
        log = CalicoLog(proc.log)
        outcome = _until_quiet(sb, fleet, lambda: log.count("in-sync") > 0, grace, deadline)
    return outcome


def run_ipamgc(sb: Sandbox, workdir: Path, grace: float, deadline: float) -> Outcome:
    """ipamgc's redis-server, one worker, the leader and the watcher on `sb` until quiet."""
    with Fleet(workdir) as fleet:
        port = free_port()
        fleet.start_redis(port)
        url = f"redis://127.0.0.1:{port}/0"
        client = redis_client(url)
        probe = Probe(client)
        try:
            _poll_until("redis-server to answer", probe.ping, fleet, 30)
            common = ["--redis-url", url, "--log-level", "INFO", "--log-format", "json"]
            kubeconfig = str(sb.kubeconfig)
            fleet.start_component(
                "worker",
                "workers",
                "ipamgc.commands.work",
                [*common, "--name", f"compare-{port}"],
                mode_env("incremental", "workers"),
            )
            lead = [*common, "--kubeconfig", kubeconfig, "--lease-namespace", LEASE_NAMESPACE]
            lead += ["--lease-name", LEADER_LEASE]
            fleet.start_component(
                "leader", "leader", "ipamgc.commands.lead", lead, mode_env("incremental", "leader")
            )
            _poll_until("the worker to register", lambda: probe.workers() >= 1, fleet, 120)
            _poll_until("the leader to hold its Lease", lambda: _leader_elected(sb), fleet, 120)
            sb.recorder.restart()
            watch = [*common, "--kubeconfig", kubeconfig, "--lease-namespace", LEASE_NAMESPACE]
            watch += ["--kick-interval", "1s"]
            fleet.start_component(
                "watcher", "watcher", "ipamgc.commands.watch", watch, mode_env("incremental", "watcher")
            )
            outcome = _until_quiet(sb, fleet, probe.synced, grace, deadline)
        except (ProcessDied, TimeoutError) as exc:
            sb.recorder.outcome.error = str(exc)
            outcome = sb.recorder.outcome
        finally:
            client.close()
    return outcome


def _leader_elected(sb: Sandbox) -> bool:
    try:
        lease = sb.store.get("leases", LEASE_NAMESPACE, LEADER_LEASE)
    except SimApiError:
        return False
    return bool((lease.get("spec") or {}).get("holderIdentity"))
