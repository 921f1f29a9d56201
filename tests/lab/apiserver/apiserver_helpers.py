"""What the simulated API server's tests (`test_apiserver*.py`) share: the objects they create, a Status
error's body, a raw watch read as JSON lines, and a plain HTTP request to the server."""

from __future__ import annotations

import contextlib
import json
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from lab.apiserver.apiserver import SimApiServer

CALICO = ("crd.projectcalico.org", "v1")


def pod(name: str, node: str | None = None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "app", "image": "busybox"}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": spec}


def block(name: str, affinity: str = "host:n1") -> dict[str, Any]:
    return {
        "apiVersion": "crd.projectcalico.org/v1",
        "kind": "IPAMBlock",
        "metadata": {"name": name},
        "spec": {"cidr": "10.0.0.0/26", "affinity": affinity, "allocations": [0, None]},
    }


def status_of(exc: ApiException) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(exc.body)
    assert body["kind"] == "Status"
    assert body["code"] == exc.status
    return body


@contextlib.contextmanager
def raw_watch(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Iterator[Iterator[dict[str, Any]]]:
    """A watch as parsed JSON lines, read with ``_preload_content=False``."""
    resp = func(*args, watch=True, _preload_content=False, **kwargs)
    try:
        yield (json.loads(line) for line in iter_resp_lines(resp) if line)
    finally:
        resp.close()
        resp.release_conn()


def take(events: Iterator[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """The next ``n`` events of a live watch (blocks until they arrive or the watch ends)."""
    return [next(events) for _ in range(n)]


def http(server: SimApiServer, method: str, path: str, body: Any = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(server.url + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=5) as resp:
        raw = resp.read()
    return raw.decode() if raw == b"ok" else json.loads(raw)
