"""`ipamgc.metrics.serve_metrics` in-process: it serves the registry with the build info, its thread
sleeps until a request comes (no periodic wake-up to look for a shutdown), and `close` ends it at once
and frees the port."""

from __future__ import annotations

import socket
import time
import urllib.request

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families

from ipamgc.metrics import serve_metrics
from tests.metrics.test_endpoints import free_port
from tests.polling import holds_for, wait_until


def _scrape(port: int, host: str = "127.0.0.1") -> dict[str, float]:
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples}


def _wake_ups(native_id: int) -> int:
    """The thread's voluntary context switches so far: one per return from a sleep."""
    with open(f"/proc/self/task/{native_id}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches in /proc")


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


def test_the_serving_thread_sleeps_between_requests() -> None:
    """prometheus-client's own loop wakes every 0.5 s; this one is asleep in `select` until a request."""
    port = free_port()
    server = serve_metrics(port, "worker", registry=CollectorRegistry(), addr="127.0.0.1")
    assert server is not None
    try:
        thread = server._thread
        assert thread.native_id is not None
        # Settled: asleep in `select` (the thread switches once on entering it after its start), i.e. its
        # count unchanged from one poll to the next.
        seen = [_wake_ups(thread.native_id)]

        def settled() -> bool:
            seen.append(_wake_ups(thread.native_id))
            return seen[-1] == seen[-2]

        wait_until(settled, timeout=10, interval=0.2, what="the metrics thread asleep")
        before = seen[-1]
        # prometheus-client's loop wakes 3 times in 1.5 s; this one not once.
        holds_for(lambda: _wake_ups(thread.native_id) == before, 1.5, what="no wake-up")
        assert thread.is_alive()
    finally:
        server.close()
    assert not server._thread.is_alive()


def test_a_taken_port_is_logged_and_skipped() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert serve_metrics(port, "worker", registry=CollectorRegistry(), addr="127.0.0.1") is None
