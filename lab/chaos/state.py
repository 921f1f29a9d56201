"""The state of one chaos run and its bookkeeping (the timeline, the components, signals, the Lease's
holder), shared by the runner (`lab.chaos.runner`), the fault actions (`lab.chaos.actions`) and
the judge (`lab.chaos.judge`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import redis

from ipamgc.stack import Stack
from ipamgc.supervisor import RESTART_BACKOFF_MIN_SECONDS, Component
from lab.apiserver.store import SimApiError, Store
from lab.chaos.hooks import ChaosFaults
from lab.chaos.nodes import NodeWatch
from lab.chaos.report import ChaosReport, StaleLeader
from lab.chaos.schedule import ALL_FAULT_KINDS, LEADER_LEASE, LEASE_NAMESPACE, ChaosOptions
from lab.cluster.cluster import SimCluster
from lab.cluster.nodechurn import NodeChurn
from shared.keys import Keys

log = logging.getLogger(__name__)

NODE_POLL_SECONDS = 0.2  # how often the deleted nodes are looked at: the resolution of their freeing time


class RunState:
    """What the runner, the fault actions and the judge of one run share: the simulated cluster and its
    API server's fault injector, the report being written, the components (once started) and the clock."""

    def __init__(self, opts: ChaosOptions) -> None:
        self.opts = opts
        self.log_dir = opts.log_dir or Path(tempfile.mkdtemp(prefix=f"ipamgc-chaos-{opts.seed}-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.rng = random.Random(opts.seed ^ 0x5EED)
        self.store = Store(seed=opts.seed)
        self.sim = SimCluster(self.store, seed=opts.seed, pod_size=opts.pod_size)
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
        self.lock = threading.Lock()
        # Node churn: the nodes it deletes, watched until they hold nothing (`lab.chaos.nodes`), and
        # the churn itself while its fault runs (the node-lost scenario leaves its leaving nodes alone).
        self.node_watch = NodeWatch(self.sim)
        self.node_churn: NodeChurn | None = None

    def note(self, kind: str, detail: str = "") -> None:
        line = f"t={time.monotonic() - self.t0:6.2f}s {kind}{': ' + detail if detail else ''}"
        with self.lock:
            self.report.timeline.append(line)
            if kind in ALL_FAULT_KINDS:
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
        self.wait_for(lambda: comp.pid is not None or (main and self.poll()), 3.0)
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

    def stack_names(self) -> list[str]:
        assert self.stack is not None
        return sorted(self.stack.supervisor.components)

    def poll(self) -> bool:
        assert self.stack is not None
        self.stack.supervisor.poll()
        with self.lock:
            for entry in self.stale:
                if entry.until is None and self.component(entry.identity).pid != entry.pid:
                    entry.until = time.time()  # the stale process is gone (its successor may lead again)
        self.node_watch.poll(every=NODE_POLL_SECONDS)
        return False
