"""Which API group Calico's objects are read and written in: the configured one, else the one the
server's discovery document says, asked once and kept.

Why it exists: the watcher and the leader both need the answer, chosen as Calico chooses it
(`shared.calicogroup.choose`), and a failed discovery must be that call's error, retried by its caller,
never a guess.
"""

from __future__ import annotations

import logging
import threading

from kubeio.errors import ApiUnavailable, translate
from kubeio.http import ApiError, Http
from shared.calicogroup import CalicoGroup, choose, served_group_names

log = logging.getLogger(__name__)


class CalicoGroupOf:
    """`group()`: Calico's API group on this server (thread-safe; discovered at the first call)."""

    def __init__(self, http: Http, configured: CalicoGroup | None) -> None:
        self._http = http
        self._group = configured
        self._lock = threading.Lock()
        if configured is not None:
            log.info("Calico API group: %s (configured)", configured)

    def group(self) -> CalicoGroup:
        with self._lock:
            if self._group is None:
                what = "discover API groups"
                try:
                    served = served_group_names(self._http.json("GET", "/apis", what=what))
                except ApiError as exc:
                    raise translate(exc, what) from exc
                except ValueError as exc:
                    raise ApiUnavailable(f"{what}: {exc}") from exc
                self._group = choose(None, served)
                log.info("Calico API group: %s (discovered)", self._group)
            return self._group
