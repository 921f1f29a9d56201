"""`ipamgc.metrics.serve_metrics` in-process: it serves the registry with the build info, its thread
sleeps until a request comes (no periodic wake-up to look for a shutdown), and `close` ends it at once
and frees the port."""

from __future__ import annotations

import socket
import socketserver
import time
import urllib.request
from typing import Any, ClassVar

import pytest
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families

from ipamgc.metrics import serve_metrics
from tests.ipamgc.commands.test_endpoints import free_port
from tests.polling import holds_for, wait_until


def _scrape(port: int, host: str = "127.0.0.1") -> dict[str, float]:
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_serves_the_registry_and_closes_at_once() -> None:
    registry = CollectorRegistry()
    Counter("ipamgc_test_things", "Things.", registry=registry).inc(3)
    port = free_port()
    server = serve_metrics(port, "worker", registry=registry, addr="127.0.0.1")
    assert server is not None
    try:
        samples = _scrape(port)
        assert samples["ipamgc_test_things_total"] == 3
        assert samples["ipamgc_build_info"] == 1
        assert _scrape(port)["ipamgc_test_things_total"] == 3  # the loop serves on after a request
    finally:
        started = time.monotonic()
        server.close()
        assert time.monotonic() - started < 2
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))  # freed
    assert "ipamgc_build_info" not in {m.name for m in registry.collect()}


class _CountingSelector(socketserver._ServerSelector):  # type: ignore[name-defined,misc]
    """The selector `handle_request` sleeps in, counting each sleep and the timeout it was given."""

    timeouts: ClassVar[list[float | None]] = []

    def select(self, timeout: float | None = None) -> Any:
        _CountingSelector.timeouts.append(timeout)
        return super().select(timeout)


def test_the_serving_thread_sleeps_between_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    """prometheus-client's own loop returns from `select` every 0.5 s to look for a shutdown; this one
    enters `select` once, without a timeout, and returns only for a request.  The loop's sleeps are
    counted in Python (a signal's EINTR retry, a GIL hand-off or a busy CI machine do not move them)."""
    timeouts: list[float | None] = []
    monkeypatch.setattr(_CountingSelector, "timeouts", timeouts)
    monkeypatch.setattr(socketserver, "_ServerSelector", _CountingSelector)
    port = free_port()
    server = serve_metrics(port, "worker", registry=CollectorRegistry(), addr="127.0.0.1")
    assert server is not None
    try:
        wait_until(lambda: len(timeouts) == 1, timeout=10, what="the metrics thread in select")
        assert timeouts == [None]
        # prometheus-client's loop would return 3 times in 1.5 s; this one not once.
        holds_for(lambda: len(timeouts) == 1, 1.5, what="one sleep in select")
        assert server._thread.is_alive()
        _scrape(port)  # a request wakes it: it serves and sleeps again
        wait_until(lambda: len(timeouts) == 2, timeout=10, what="the next sleep after a request")
        assert timeouts == [None, None]
    finally:
        server.close()
    assert not server._thread.is_alive()


def test_a_taken_port_is_logged_and_skipped() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert serve_metrics(port, "worker", registry=CollectorRegistry(), addr="127.0.0.1") is None
