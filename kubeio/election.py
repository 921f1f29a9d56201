"""Leader election on a Kubernetes Lease, for the watcher (one publisher) and the leader (one writer).

Why it exists: `kubernetes.leaderelection.run()` sleeps uninterruptibly and does not stop the work when
the Lease is lost (design.md), and the two components once each had their own loop around client-go's
algorithm (`kubeio.lease.Lease`), with different deadlines.  One loop here:

- `Elector.run(halt)` acquires the Lease, then renews it every retry period; every wait is interruptible
  by `halt`.  After a failed renewal it retries every `min(retry, 0.5)` s until it succeeds or the
  Lease is no longer held by our clock, then `Leadership.lose()` and `on_lost` (the component stops its
  work and exits; its supervisor restarts it as a standby).
- `Leadership.held()` is what the work asks before each write: true only while the last successful
  renewal is younger than the renew deadline, measured from *before* that renewal's request on the
  monotonic clock, so shorter than the lease duration after which a standby may take over.
- `Elector.release()` gives the Lease up on a graceful stop (holder emptied), so a standby takes over
  within one retry period instead of waiting for the Lease to expire.

The API server is the fence: the Lease is replaced with its resourceVersion, so of two candidates racing
only one write succeeds (409 for the other).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger(__name__)


def default_identity() -> str:
    """Unique per process: two replicas on one host, or a restarted one, never share an identity."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class Leadership:
    """What the work loop asks before every write: do we still hold the Lease, by our own clock?"""

    def __init__(self, identity: str, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.identity = identity
        self.monotonic = monotonic
        self.leading = threading.Event()
        self.lost = threading.Event()
        self._held_until = float("-inf")
        self._lock = threading.Lock()

    @classmethod
    def granted(cls, identity: str) -> Leadership:
        """Leadership without an election (tests, single-replica runs): held until `lose()`."""
        lead = cls(identity)
        lead.renewed(float("inf"))
        return lead

    def renewed(self, until: float) -> None:
        with self._lock:
            self._held_until = until
        self.leading.set()

    def lose(self) -> None:
        with self._lock:
            self._held_until = float("-inf")
        self.lost.set()
        self.leading.clear()

    def held(self) -> bool:
        if self.lost.is_set() or not self.leading.is_set():
            return False
        with self._lock:
            return self.monotonic() < self._held_until


class Candidate(Protocol):
    """One attempt at a time to acquire or renew the Lease (`kubeio.lease.Lease`)."""

    def try_acquire_or_renew(self) -> bool: ...

    def release(self) -> bool: ...


class Elector:
    """Acquire the Lease, then renew it every retry period until `halt` is set or renewal fails for
    longer than the renew deadline (then `Leadership.lose()` and `on_lost`).  Every wait is interruptible."""

    def __init__(
        self,
        candidate: Candidate,
        leadership: Leadership,
        *,
        renew_seconds: float,
        retry_seconds: float,
        lease: str = "",
        on_started: Callable[[], None] = lambda: None,
        on_lost: Callable[[], None] = lambda: None,
    ) -> None:
        self.candidate = candidate
        self.leadership = leadership
        self.renew = renew_seconds
        self.retry = retry_seconds
        self.on_started = on_started
        self.on_lost = on_lost
        self.extra = {"lease": lease, "identity": leadership.identity}

    def _try(self) -> bool:
        started = self.leadership.monotonic()
        if not self.candidate.try_acquire_or_renew():
            return False
        self.leadership.renewed(started + self.renew)
        return True

    def run(self, halt: threading.Event) -> None:
        """Block until `halt` is set or the Lease is lost (then `on_lost` has been called)."""
        log.info("waiting to lead", extra=self.extra)
        while not self._try():
            if halt.wait(self.retry):
                return
        log.info("acquired the lease", extra=self.extra)
        self.on_started()
        while not halt.wait(self.retry):
            if self._try():
                continue
            while not self._try():
                if not self.leadership.held():
                    log.error("lost the lease: stop the work", extra=self.extra)
                    self.leadership.lose()
                    self.on_lost()
                    return
                if halt.wait(min(self.retry, 0.5)):
                    return

    def release(self) -> bool:
        """Give the Lease up (holder emptied) if we still hold it; best effort, returns whether it was."""
        lead = self.leadership
        if not lead.leading.is_set() or lead.lost.is_set():
            return False
        lead.leading.clear()
        done = self.candidate.release()
        if done:
            log.info("released the lease", extra=self.extra)
        return done
