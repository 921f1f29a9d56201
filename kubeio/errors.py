"""API failures as `shared.errors` errors: the one place an HTTP status becomes transient or permanent.

Why it exists: the watcher and the leader once each had their own status table (`producer/kube.py`,
`workers/leader/kube.py`), and the two had drifted (409 and 410 were read differently).  Here one class tree,
after the house style's "API errors as a status-code class tree":

    KubeError (status, retry_after)
    ├── KubeTransientError: worth retrying as-is, with back-off
    │   ├── Conflict            409: the object changed since we read it; re-read, re-decide
    │   ├── ResourceExpired     410: the resourceVersion or continue token is compacted away; relist
    │   └── ApiUnavailable      429, 5xx, no answer (status 0), an unreadable body or stream
    └── KubePermanentError: retrying as-is cannot help (log, count, skip)
        ├── NotFound            404
        └── ApiRefused          401, 403, 422 and any other answer

`translate` turns what a request raised (`kubeio.http.ApiError`, a urllib3 or socket error, an unreadable
JSON body) into that tree, with a one-line message and the Retry-After a 429/503 carried.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from email.utils import parsedate_to_datetime

import orjson

from kubeio.http import ApiError
from shared.errors import IpamgcError, PermanentError, TransientError

# Retry-After values above this are not honoured as-is (a misbehaving proxy must not park us for hours).
MAX_RETRY_AFTER_SECONDS = 600.0


class KubeError(IpamgcError):
    """An API failure; `status` is the HTTP status (0: no usable answer), `retry_after` seconds or None."""

    status = 0

    def __init__(self, message: str, *, status: int | None = None, retry_after: float | None = None) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status
        self.retry_after = retry_after


class KubeTransientError(KubeError, TransientError):
    """Worth retrying: 409, 410, 429, 5xx, a dropped connection, an unreadable body or stream."""


class Conflict(KubeTransientError):
    """409: the object changed since we read it (or a delete precondition failed): re-read, re-decide."""

    status = 409


class ResourceExpired(KubeTransientError):
    """410 Gone: the resourceVersion (or continue token) is compacted away; relist."""

    status = 410


class ApiUnavailable(KubeTransientError):
    """429, 5xx, no answer at all, an unreadable body: retry later (after Retry-After when given)."""


class KubePermanentError(KubeError, PermanentError):
    """An answer retrying cannot fix as-is."""


class NotFound(KubePermanentError):
    status = 404


class ApiRefused(KubePermanentError):
    """401, 403, 422, and any other answer that is neither success nor worth a retry."""


def retry_after_of(headers: Mapping[str, str] | None, body: object = None) -> float | None:
    """Seconds from a Retry-After header (delta or HTTP date), else from a Status document's details."""
    value = headers.get("Retry-After") if headers is not None else None
    if value:
        try:
            return min(max(0.0, float(value)), MAX_RETRY_AFTER_SECONDS)
        except ValueError:
            with contextlib.suppress(TypeError, ValueError):
                when = parsedate_to_datetime(value).timestamp()
                return min(max(0.0, when - time.time()), MAX_RETRY_AFTER_SECONDS)
    if isinstance(body, Mapping):
        details = body.get("details")
        seconds = details.get("retryAfterSeconds") if isinstance(details, Mapping) else None
        if isinstance(seconds, int) and not isinstance(seconds, bool) and seconds > 0:
            return min(float(seconds), MAX_RETRY_AFTER_SECONDS)
    return None


def classify_status(status: int, message: str, retry_after: float | None = None) -> KubeError:
    """The error an answer with `status` is (see the tree in the module docstring)."""
    if status == 404:
        return NotFound(message)
    if status == 409:
        return Conflict(message, retry_after=retry_after)
    if status == 410:
        return ResourceExpired(message)
    if status == 429 or status >= 500 or status == 0:
        return ApiUnavailable(message, status=status, retry_after=retry_after)
    return ApiRefused(message, status=status)


def translate(exc: Exception, what: str) -> KubeError:
    """What a request raised, as a `KubeError` (the only place library exceptions are translated).
    An `ApiError` keeps its own one-line message (it names the request); anything else was no usable
    answer: `what` names the request."""
    if isinstance(exc, ApiError):
        if exc.status == 0:
            return ApiUnavailable(str(exc), status=0)
        body: object = None
        with contextlib.suppress(orjson.JSONDecodeError):
            body = orjson.loads(exc.body) if exc.body else None
        return classify_status(exc.status, str(exc), retry_after_of(exc.headers, body))
    return ApiUnavailable(f"{what}: {type(exc).__name__}: {exc}", status=0)
