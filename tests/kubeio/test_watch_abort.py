"""Stopping a watch never raises: `WatchStream.abort` runs from the watcher's thread as it stops, and an
exception there crashed that thread (urllib3 raises ValueError when the response has no socket left to
shut down: the stream had already ended and its connection was released)."""

from __future__ import annotations

import pytest

from kubeio.watch import WatchStream
from producer.kinds import Kind


class _Released:
    """A urllib3 response whose connection is gone, as `HTTPResponse.shutdown` sees it."""

    def __init__(self, error: type[Exception]) -> None:
        self.error = error
        self.shutdowns = 0

    def shutdown(self) -> None:
        self.shutdowns += 1
        raise self.error("Cannot shutdown socket as self._sock_shutdown is not set")


@pytest.mark.parametrize("error", [ValueError, OSError])
def test_aborting_a_watch_whose_connection_is_gone_does_not_raise(error: type[Exception]) -> None:
    resp = _Released(error)
    stream = WatchStream(Kind.PODS, resp)  # type: ignore[arg-type]
    stream.abort()
    assert resp.shutdowns == 1
    assert stream._aborted
