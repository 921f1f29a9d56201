"""`/healthz`, `/livez`, `/readyz` on a metrics port (ipamgc/healthz.py), in-process: answered from the
probe in memory, 503 once the main loop stalls, readiness failing while the server shuts down, Redis never
read, and every other path still the registry's `/metrics`."""

from __future__ import annotations

import urllib.error
import urllib.request

from prometheus_client import CollectorRegistry, Counter

from ipamgc.metrics import serve_metrics
from tests.ipamgc.commands.test_endpoints import free_port


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_health_paths_follow_the_probe_and_metrics_stay_served() -> None:
    state: dict[str, object] = {"alive": True, "state": "standby"}

    def probe() -> tuple[bool, str]:
        return bool(state["alive"]), str(state["state"])

    registry = CollectorRegistry()
    Counter("ipamgc_test_things", "Things.", registry=registry).inc()
    port = free_port()
    server = serve_metrics(port, "watcher", registry=registry, addr="127.0.0.1", probe=probe)
    assert server is not None
    try:
        for path in ("/healthz", "/livez", "/readyz"):
            assert _get(port, path) == (200, "ok")  # a standby is ready: a rollout's new replicas are
        assert _get(port, "/readyz?verbose") == (200, "[+]watcher standby\nreadyz check passed\n")
        status, body = _get(port, "/metrics")
        assert status == 200 and "ipamgc_test_things_total 1.0" in body
        state.update(alive=False, state="active")
        for path in ("/healthz", "/livez", "/readyz"):
            assert _get(port, path) == (503, f"{path[1:]} check failed: main loop stalled (active)\n")
        verbose = "[-]watcher main loop stalled (active)\nlivez check failed\n"
        assert _get(port, "/livez?verbose") == (503, verbose)
        state.update(alive=True)
        server.health.closing = True  # what close() sets first
        assert _get(port, "/livez") == (200, "ok")
        assert _get(port, "/readyz") == (503, "readyz check failed: shutting down\n")
    finally:
        server.close()


def test_a_probe_set_later_and_a_probe_that_raises() -> None:
    port = free_port()
    server = serve_metrics(port, "leader", registry=CollectorRegistry(), addr="127.0.0.1")
    assert server is not None
    try:
        assert _get(port, "/healthz?verbose") == (200, "[+]leader running\nhealthz check passed\n")

        def broken() -> tuple[bool, str]:
            raise RuntimeError("no loop")

        server.health.probe = broken
        failed = "healthz check failed: probe failed: RuntimeError('no loop')\n"
        assert _get(port, "/healthz") == (503, failed)
        server.health.probe = lambda: (True, "leading")
        assert _get(port, "/readyz?verbose") == (200, "[+]leader leading\nreadyz check passed\n")
    finally:
        server.close()
    assert server.health.closing
