"""One attempt at a time to acquire or renew a coordination.k8s.io/v1 Lease, as client-go's
`LeaderElector.tryAcquireOrRenew` does it, in raw JSON (`kubeio.http`).

The loops around it are the components' own (`producer.election`, `workers.leader.election`): interruptible
waits, the renew deadline, stopping the work when the Lease is lost.  What this does, per attempt:
- holding it (our last write is younger than the lease duration): renew with one conditional PUT of
  our last written object (client-go's fast path); a 409 or any error falls back to the full attempt;
- else read it: absent → create it; held by someone else whose record we have not seen change for
  `leaseDurationSeconds` (measured on our monotonic clock from when we first saw that record, never
  from the timestamps in it, so clock skew between hosts cannot expire a live leader) → not ours;
  otherwise take it (acquireTime now, leaderTransitions + 1 when the holder changes) with a PUT
  conditional on the resourceVersion just read.
The API server is the fence: of two candidates racing, one PUT succeeds and the other gets a 409.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kubeio.http import ApiError, Http, JsonObj, path_part

log = logging.getLogger(__name__)


def micro_time(at: dt.datetime) -> str:
    """A Kubernetes MicroTime (RFC 3339 with microseconds, UTC)."""
    return at.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Lease:
    """A candidate for one Lease, identified by `identity`."""

    def __init__(
        self,
        http: Http,
        *,
        namespace: str,
        name: str,
        identity: str,
        lease_seconds: int,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self.http = http
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_seconds = lease_seconds
        self._monotonic = monotonic
        self._wall = wall
        self._collection = f"/apis/coordination.k8s.io/v1/namespaces/{path_part(namespace)}/leases"
        self._path = f"{self._collection}/{path_part(name)}"
        self._lock = threading.Lock()
        self._ours: JsonObj | None = None  # our last successful write (its resourceVersion included)
        self._ours_at = 0.0  # monotonic time of that write
        self._seen: tuple[Any, ...] | None = None  # the other holder's record as last read
        self._seen_at = 0.0  # monotonic time we first read that record
        self.observed_holder: str | None = None  # the holder as last read or written ('' = nobody)

    def try_acquire_or_renew(self) -> bool:
        """True when we hold the Lease after this call (False also on any API error, logged)."""
        with self._lock:
            try:
                return self._attempt()
            except ApiError as exc:
                log.warning(
                    "lease %s/%s: %s", self.namespace, self.name, exc, extra={"identity": self.identity}
                )
                self._ours = None
                return False

    def _attempt(self) -> bool:
        now = self._wall()
        if self._ours is not None and self._monotonic() - self._ours_at < self.lease_seconds:
            body = _with_spec(self._ours, renewTime=micro_time(now))
            try:
                return self._write("PUT", self._path, body, "renew")
            except ApiError as exc:
                if exc.status != 409:
                    raise
                self._ours = None  # someone wrote it since: read it and decide again
        try:
            current = self.http.json("GET", self._path, what=f"get lease {self.name}")
        except ApiError as exc:
            if exc.status != 404:
                raise
            return self._create(now)
        found = current.get("spec")
        spec: JsonObj = found if isinstance(found, dict) else {}
        holder = spec.get("holderIdentity") or ""
        self.observed_holder = holder
        if holder and holder != self.identity:
            record = (holder, spec.get("renewTime"), spec.get("acquireTime"), spec.get("leaseTransitions"))
            if record != self._seen:
                self._seen, self._seen_at = record, self._monotonic()
            duration = spec.get("leaseDurationSeconds")
            duration = duration if isinstance(duration, int) and duration > 0 else self.lease_seconds
            if self._monotonic() - self._seen_at < duration:
                return False
        transitions = spec.get("leaseTransitions")
        transitions = transitions if isinstance(transitions, int) and transitions >= 0 else 0
        changes: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.lease_seconds,
            "renewTime": micro_time(now),
        }
        if holder != self.identity:
            changes["acquireTime"] = micro_time(now)
            changes["leaseTransitions"] = transitions + 1 if holder else transitions
        try:
            return self._write("PUT", self._path, _with_spec(current, **changes), "acquire")
        except ApiError as exc:
            if exc.status == 409:
                return False  # another candidate won the race
            raise

    def _create(self, now: dt.datetime) -> bool:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": self.lease_seconds,
                "acquireTime": micro_time(now),
                "renewTime": micro_time(now),
                "leaseTransitions": 0,
            },
        }
        try:
            return self._write("POST", self._collection, body, "create")
        except ApiError as exc:
            if exc.status == 409:
                return False  # created by another candidate meanwhile
            raise

    def _write(self, method: str, path: str, body: JsonObj, what: str) -> bool:
        started = self._monotonic()
        written = self.http.json(method, path, what=f"{what} lease {self.name}", body=body)
        spec = written.get("spec")
        if not isinstance(spec, dict) or spec.get("holderIdentity") != self.identity:
            self._ours = None
            return False
        self._ours, self._ours_at = written, started
        self.observed_holder = self.identity
        return True

    def release(self) -> bool:
        """Empty the holder if our last write is still the Lease (a PUT at its resourceVersion: a 409
        means someone wrote it since); best effort, returns whether it was done."""
        with self._lock:
            ours, self._ours = self._ours, None
            if ours is None:
                return False
            now = micro_time(self._wall())
            body = _with_spec(ours, holderIdentity="", renewTime=now)
            try:
                self.http.json("PUT", self._path, what=f"release lease {self.name}", body=body)
            except ApiError as exc:
                log.warning("could not release lease %s/%s: %s", self.namespace, self.name, exc)
                return False
            return True


def _with_spec(obj: JsonObj, **changes: Any) -> JsonObj:
    """`obj` with `changes` in its spec (metadata, resourceVersion included, kept as read)."""
    spec = obj.get("spec")
    return {**obj, "spec": {**(spec if isinstance(spec, dict) else {}), **changes}}
