"""`/healthz`, `/livez` and `/readyz` on a component's metrics port, as Kubernetes components serve them.

Why here and not in Redis: the exec probes this replaces started a Python interpreter per probe
(`python -m ipamgc.commands.health`, ~0.35 CPU s each, three probes every 30 s per pod), more than the
collecting itself; and their readiness read Redis, so with `maxUnavailable: 0` a Redis outage held every
rollout.  These answer from the process's memory: the probe the heartbeat already uses (`Probe`: the
main loop came round within `STALL_SECONDS`), no Redis, no allocation beyond the response.

- `/healthz`, `/livez` (liveness): 200 while the main loop comes round, 503 once it stalled: the kubelet
  restarts a stuck process.
- `/readyz` (readiness): the same, and 503 once the process is shutting down (`MetricsServer.close`).
  A standby (waiting on its Lease) is ready: a rollout's new replicas start as standbys.  Redis is never
  read: a Redis outage makes no pod unready, so it holds up no rollout; the alerts and `ipamgc health`
  see Redis.
- `?verbose` adds the component's state (`active`, `standby`, `syncing`, `leading`, `running`), as
  Kubernetes' `[+]` lines do.

Every other path goes to prometheus-client's WSGI app (`/metrics`).  docs/operations.md gives the cost
of a probe, measured.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

Probe = Callable[[], tuple[bool, str]]  # → (alive, state)
WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
HEALTH_PATHS = frozenset({"/healthz", "/livez", "/readyz"})
_TYPE = ("Content-Type", "text/plain; charset=utf-8")
_NO_STORE = ("Cache-Control", "no-store")


def _running() -> tuple[bool, str]:
    return True, "running"


class HealthApp:
    """The WSGI app of a metrics port: health paths answered here, the rest by `metrics`.

    `probe` may be replaced after the server started (the leader's metrics exist only once it serves);
    `closing` is set when the server begins to shut down.
    """

    def __init__(self, metrics: WSGIApp, component: str, probe: Probe | None = None) -> None:
        self.metrics = metrics
        self.component = component
        self.probe: Probe = probe or _running
        self.closing = False

    def check(self, path: str) -> tuple[bool, str]:
        """(healthy, the reason's line) of one health path."""
        try:
            alive, state = self.probe()
        except Exception as exc:  # noqa: BLE001 - a probe that raises is a failed check, not a 500
            return False, f"probe failed: {exc!r}"
        if not alive:
            return False, f"main loop stalled ({state})"
        if path == "/readyz" and self.closing:
            return False, "shutting down"
        return True, state

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path not in HEALTH_PATHS:
            return self.metrics(environ, start_response)
        ok, why = self.check(path)
        name = path.lstrip("/")
        if "verbose" in environ.get("QUERY_STRING", ""):
            mark = "+" if ok else "-"
            body = f"[{mark}]{self.component} {why}\n{name} check {'passed' if ok else 'failed'}\n"
        else:
            body = "ok" if ok else f"{name} check failed: {why}\n"
        data = body.encode()
        # a new list each time: wsgiref adds to the one it is given
        headers = [_TYPE, _NO_STORE, ("Content-Length", str(len(data)))]
        start_response("200 OK" if ok else "503 Service Unavailable", headers)
        return [data]
