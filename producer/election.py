"""Only one watcher publishes: a Kubernetes Lease (coordination.k8s.io/v1) elects it.

Built on the client's `kubernetes.leaderelection` (`LeaderElection.try_acquire_or_renew` with a
`LeaseLock`), with our own loop around it, because the client's `run()` sleeps uninterruptibly, builds
its lock on the global default ApiClient, and does not stop the leader's work when the lease is lost
(design.md).  Here every wait is interruptible by `stop`, the lock uses the watcher's ApiClient, and
losing the lease calls `on_lost` at once so that the watcher stops publishing and exits (its
supervisor restarts it as a standby).  The API server is the fence: the Lease is replaced with its
resourceVersion, so of two candidates racing only one write succeeds (409 for the other).

A graceful stop releases the Lease (empty holder), so a standby takes over within one retry period
instead of waiting for the lease to expire.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.leaderelectionrecord import LeaderElectionRecord
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

log = logging.getLogger(__name__)

_Config: Any = electionconfig.Config
_LeaderElection: Any = leaderelection.LeaderElection
_Record: Any = LeaderElectionRecord


def default_identity() -> str:
    """Unique per process: two replicas on one host, or a restarted one, never share an identity."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class _LeaseLock(LeaseLock):
    """`LeaseLock` on a given ApiClient (the original builds one from the global default config)."""

    def __init__(self, name: str, namespace: str, identity: str, api: k8s.ApiClient) -> None:
        self.api_instance = k8s.CoordinationV1Api(api)
        self.name = name
        self.namespace = namespace
        self.identity = identity
        self.lease_reference = None


class LeaseElector:
    """Acquire the Lease, keep renewing it, and say so (`leading`) until it is lost or `stop` is set."""

    def __init__(
        self,
        api: k8s.ApiClient,
        *,
        namespace: str,
        name: str,
        identity: str | None = None,
        lease_seconds: int = 15,
        renew_seconds: float = 10.0,
        retry_seconds: float = 2.0,
        on_started: Callable[[], None] = lambda: None,
        on_lost: Callable[[], None] = lambda: None,
    ) -> None:
        self.identity = identity or default_identity()
        # kubernetes.leaderelection has no type hints: its objects are Any here.
        self.lock: Any = _LeaseLock(name, namespace, self.identity, api)
        self.config: Any = _Config(
            self.lock,
            lease_duration=lease_seconds,
            renew_deadline=renew_seconds,
            retry_period=retry_seconds,
            onstarted_leading=on_started,
            onstopped_leading=on_lost,
        )
        self.election: Any = _LeaderElection(self.config)
        self.stop = threading.Event()
        self.leading = threading.Event()
        self.lost = threading.Event()
        self._extra = {"lease": f"{namespace}/{name}", "identity": self.identity}

    def run(self) -> None:
        """Block until `stop` is set or the lease is lost (then `on_lost` has been called)."""
        retry = float(self.config.retry_period)
        log.info("waiting to lead", extra=self._extra)
        while not self._try():
            if self.stop.wait(retry):
                return
        log.info("leading", extra=self._extra)
        self.leading.set()
        self.config.onstarted_leading()
        while not self.stop.wait(retry):
            deadline = time.monotonic() + float(self.config.renew_deadline)
            while not self._try():
                if time.monotonic() >= deadline:
                    self._lose()
                    return
                if self.stop.wait(retry):
                    return

    def _try(self) -> bool:
        try:
            return bool(self.election.try_acquire_or_renew())
        except (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            log.warning("lease %s: %s", self.lock.name, exc, extra=self._extra)
            return False

    def _lose(self) -> None:
        log.error("lost the lease: stop publishing", extra=self._extra)
        self.leading.clear()
        self.lost.set()
        self.config.onstopped_leading()

    def release(self) -> bool:
        """Give the Lease up (holder emptied) if we still hold it; best effort, returns whether it was."""
        if not self.leading.is_set() or self.lost.is_set():
            return False
        self.leading.clear()
        now = str(dt.datetime.fromtimestamp(time.time()))
        try:
            # Re-read it (the lock keeps the resourceVersion of its last read, not of our last renewal),
            # then replace it at that resourceVersion: 409 if anyone wrote it in between.
            found, current = self.lock.get(self.lock.name, self.lock.namespace)
            if not found or current is None or current.holder_identity != self.identity:
                return False
            acquired = current.acquire_time or now
            record = _Record("", str(self.config.lease_duration), acquired, now)
            done = bool(self.lock.update(self.lock.name, self.lock.namespace, record))
        except (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            log.warning("could not release the lease: %s", exc, extra=self._extra)
            return False
        if done:
            log.info("released the lease", extra=self._extra)
        return done
