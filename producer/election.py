"""Only one watcher publishes: a Kubernetes Lease elects it (`kubeio.election`, the leader's loop too).

Why it exists: the watcher's side of the election in the shape its run loop uses — a `run()` for the
election thread, `stop` to end it, `leading` / `lost` to read, `release()` on a graceful stop — over
`kubeio.election.Elector` on our ApiClient.  Losing the Lease calls `on_lost` at once so that the
watcher stops publishing and exits (its supervisor restarts it as a standby).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from kubeio.client import ApiClient
from kubeio.election import Elector, Leadership, default_identity
from kubeio.http import Http
from kubeio.lease import Lease


class LeaseElector:
    """Acquire the Lease, keep renewing it, and say so (`leading`) until it is lost or `stop` is set."""

    def __init__(
        self,
        api: ApiClient,
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
        self.lease = lease = Lease(
            Http(api), namespace=namespace, name=name, identity=self.identity, lease_seconds=lease_seconds
        )
        self.leadership = Leadership(self.identity)
        self._elector = Elector(
            lease,
            self.leadership,
            renew_seconds=renew_seconds,
            retry_seconds=retry_seconds,
            lease=f"{namespace}/{name}",
            on_started=on_started,
            on_lost=on_lost,
        )
        self.stop = threading.Event()
        self.leading = self.leadership.leading
        self.lost = self.leadership.lost

    def run(self) -> None:
        """Block until `stop` is set or the Lease is lost (then `on_lost` has been called)."""
        self._elector.run(self.stop)

    def release(self) -> bool:
        """Give the Lease up (holder emptied) if we still hold it; best effort, returns whether it was."""
        return self._elector.release()
