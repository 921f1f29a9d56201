"""Pod churn for the simulated cluster: a steady rate of pod events, a fraction of deletions leaking.

A pod event is one pod created (scheduled, CNI ADD, status) or one pod deleted (CNI DEL then object
removal, or, with probability `leak_rate`, the object removed without CNI DEL: a leak).  The population
stays near its starting size.  Seeded, so a run is reproducible event for event.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from lab.cluster.cluster import SimCluster, node_name

log = logging.getLogger(__name__)


@dataclass
class ChurnStats:
    created: int = 0
    deleted: int = 0
    leaked: int = 0
    errors: int = 0
    leaked_ips: list[str] = field(default_factory=list)

    @property
    def events(self) -> int:
        return self.created + self.deleted + self.leaked


class Churn:
    def __init__(
        self,
        sim: SimCluster,
        rate: float,
        leak_rate: float = 0.0,
        seed: int = 0,
        namespaces: int = 10,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if rate <= 0:
            raise ValueError("churn rate must be positive (events per second)")
        if not 0.0 <= leak_rate <= 1.0:
            raise ValueError("leak rate must be within 0..1")
        self.sim = sim
        self.rate = rate
        self.leak_rate = leak_rate
        self.rng = random.Random(seed)
        self.namespaces = namespaces
        self.clock = clock
        self.sleep = sleep
        self.stats = ChurnStats()
        self.target = max(sim.pod_count(), 1)
        self._nodes = sorted(sim.node_names)

    def step(self) -> str:
        """One pod event; returns its kind (`create`, `delete` or `leak`)."""
        count = self.sim.pod_count()
        create = count < self.target * 0.95 or (count <= self.target * 1.05 and self.rng.random() < 0.5)
        try:
            if create or count == 0:
                self._create()
                self.stats.created += 1
                return "create"
            key = self.sim.random_pod()
            if key is None:
                return "none"
            if self.rng.random() < self.leak_rate:
                self.stats.leaked_ips.extend(self.sim.leak_pod_deleted_without_cni_del(*key))
                self.stats.leaked += 1
                return "leak"
            self.sim.delete_pod(*key)
            self.stats.deleted += 1
            return "delete"
        except Exception:  # a load generator keeps going; the error is logged and counted
            self.stats.errors += 1
            log.exception("churn event failed")
            return "error"

    def _create(self) -> None:
        if not self._nodes or len(self._nodes) != len(self.sim.node_names):
            # Nodes come and go (a lost node): pods are scheduled on live ones only, as a scheduler does.
            self._nodes = sorted(self.sim.node_names) or [node_name(0)]
        node = self.rng.choice(self._nodes)
        self.sim.churn_serial += 1  # the cluster's: names an earlier driver used are never reused
        serial = self.sim.churn_serial
        self.sim.create_pod(f"ns-{serial % self.namespaces}", f"churn-{serial:07d}", node)

    def run(self, duration: float | None = None, stop: threading.Event | None = None) -> ChurnStats:
        """Emit events at `rate` per second until `duration` elapses or `stop` is set."""
        start = self.clock()
        n = 0
        while (duration is None or self.clock() - start < duration) and not (stop and stop.is_set()):
            self.step()
            n += 1
            delay = start + n / self.rate - self.clock()
            if delay > 0:
                if stop is not None:
                    stop.wait(delay)
                else:
                    self.sleep(delay)
        return self.stats

    def start(self, stop: threading.Event) -> threading.Thread:
        thread = threading.Thread(target=self.run, kwargs={"stop": stop}, name="sim-churn", daemon=True)
        thread.start()
        return thread
