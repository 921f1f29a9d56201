"""The simulated API server's request log: what clients asked for, and what they got.

Tests of a controller often need to assert on its traffic rather than on the objects it
left behind: that a stale leader's write was refused, that a list was paginated, that no
request touched a resource it should not. Every request the server answers (control
endpoints aside) becomes a :class:`RequestRecord` in a bounded, thread-safe
:class:`RequestLog`, searchable with :meth:`RequestLog.find`.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

__all__ = ["RequestLog", "RequestRecord"]


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One served request. ``verb`` is the Kubernetes verb (or "discovery"/"health")."""

    timestamp: float
    method: str
    path: str
    query: dict[str, str]
    status: int
    verb: str
    resource: str | None
    name: str | None
    namespace: str | None
    subresource: str | None
    user_agent: str
    client: str
    duration: float
    fault: str | None
    #: The resourceVersion a write was conditional on: ``metadata.resourceVersion`` of a PUT
    #: or PATCH body, or ``preconditions.resourceVersion`` of a DELETE; None if unconditional.
    precondition: str | None = None


class RequestLog:
    """A bounded, thread-safe log of :class:`RequestRecord`."""

    def __init__(self, maxlen: int = 100_000) -> None:
        self._lock = threading.Lock()
        self._records: deque[RequestRecord] = deque(maxlen=maxlen)

    def append(self, record: RequestRecord) -> None:
        """Record one request."""
        with self._lock:
            self._records.append(record)

    def records(self) -> list[RequestRecord]:
        """All retained records, oldest first."""
        with self._lock:
            return list(self._records)

    def clear(self) -> None:
        """Forget every record."""
        with self._lock:
            self._records.clear()

    def find(self, **criteria: Any) -> list[RequestRecord]:
        """Records whose fields equal every given criterion; ``since`` filters on timestamp.

        Example: ``find(method="PUT", resource="ipamblocks", user_agent="stale-leader")``.
        """
        since = criteria.pop("since", None)
        bad = set(criteria) - set(RequestRecord.__dataclass_fields__)
        if bad:
            raise TypeError(f"unknown request fields: {sorted(bad)}")
        return [
            r
            for r in self.records()
            if (since is None or r.timestamp >= since)
            and all(getattr(r, k) == v for k, v in criteria.items())
        ]
