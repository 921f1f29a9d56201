"""Faults that need more than a rule of the simulated API server: a hook fired on a given request (a
leader killed mid-release), a concurrent writer bumping blocks (a conflict storm), the churn in a thread.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from lab.apiserver.faults import FaultDecision, FaultInjector
from lab.apiserver.store import SimApiError
from lab.cluster.churn import Churn
from lab.cluster.cluster import SimCluster
from shared.netaddr import cidr_to_name, parse_ip, parse_network

log = logging.getLogger(__name__)


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
