"""Only one watcher publishes: a Kubernetes Lease (coordination.k8s.io/v1) elects it.

Each attempt is `kubeio.lease.Lease.try_acquire_or_renew` (client-go's algorithm, in raw JSON); the loop
around it is ours, because the official client's `kubernetes.leaderelection.run()` sleeps
uninterruptibly and does not stop the leader's work when the lease is lost (design.md).  Here every wait
is interruptible by `stop`, and losing the lease calls `on_lost` at once so that the watcher stops
publishing and exits (its supervisor restarts it as a standby).  The API server is the fence: the Lease
is replaced with its resourceVersion, so of two candidates racing only one write succeeds (409 for the
other).

A graceful stop releases the Lease (empty holder), so a standby takes over within one retry period
instead of waiting for the lease to expire.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable

from kubernetes import client as k8s

from kubeio.http import Http
from kubeio.lease import Lease

log = logging.getLogger(__name__)


def default_identity() -> str:
    """Unique per process: two replicas on one host, or a restarted one, never share an identity."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


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
        self.lease = Lease(
            Http(api), namespace=namespace, name=name, identity=self.identity, lease_seconds=lease_seconds
        )
        self.renew_seconds = renew_seconds
        self.retry_seconds = retry_seconds
        self.on_started = on_started
        self.on_lost = on_lost
        self.stop = threading.Event()
        self.leading = threading.Event()
        self.lost = threading.Event()
        self._extra = {"lease": f"{namespace}/{name}", "identity": self.identity}

    def run(self) -> None:
        """Block until `stop` is set or the lease is lost (then `on_lost` has been called)."""
        retry = self.retry_seconds
        log.info("waiting to lead", extra=self._extra)
        while not self.lease.try_acquire_or_renew():
            if self.stop.wait(retry):
                return
        log.info("leading", extra=self._extra)
        self.leading.set()
        self.on_started()
        while not self.stop.wait(retry):
            deadline = time.monotonic() + self.renew_seconds
            while not self.lease.try_acquire_or_renew():
                if time.monotonic() >= deadline:
                    self._lose()
                    return
                if self.stop.wait(retry):
                    return

    def _lose(self) -> None:
        log.error("lost the lease: stop publishing", extra=self._extra)
        self.leading.clear()
        self.lost.set()
        self.on_lost()

    def release(self) -> bool:
        """Give the Lease up (holder emptied) if we still hold it; best effort, returns whether it was."""
        if not self.leading.is_set() or self.lost.is_set():
            return False
        self.leading.clear()
        done = self.lease.release()
        if done:
            log.info("released the lease", extra=self._extra)
        return done
