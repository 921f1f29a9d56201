"""The simulated API server's test control plane: ``/_sim/...`` endpoints over HTTP.

Tests that drive the server from another process (a CLI run, a subprocess, a benchmark)
cannot reach :class:`~lab.apiserver.apiserver.SimApiServer` in memory, so the same test
helpers are served over HTTP under ``/_sim/``: ``faults`` (GET lists, POST adds or
controls, DELETE clears the fault rules), ``requests`` (GET searches the request log by
any :class:`~lab.apiserver.requestlog.RequestRecord` field, DELETE clears it) and
``compact`` (POST compacts the store's history). These requests are not logged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from lab.apiserver.requestlog import RequestRecord
from lab.apiserver.resources import JsonObj, SimApiError
from lab.apiserver.serving import Server

__all__ = ["control"]

_NOT_FOUND = "the server could not find the requested resource"


def control(sim: Server, method: str, parts: list[str], payload: Any, query: Mapping[str, str]) -> JsonObj:
    """Serve ``method /_sim/<parts>`` with the JSON ``payload``; the response document."""
    if parts == ["faults"] and method in ("GET", "POST", "DELETE"):
        if method == "DELETE":
            payload = {"action": "clear"}
        try:
            result: JsonObj = sim.faults.control(payload if method != "GET" else {"action": "list"})
        except (ValueError, TypeError, KeyError) as exc:
            raise SimApiError.bad_request(f"invalid fault request: {exc}") from None
        return result
    if parts == ["requests"] and method == "GET":
        criteria: dict[str, Any] = {k: v for k, v in query.items() if k in RequestRecord.__dataclass_fields__}
        if "status" in criteria:
            criteria["status"] = int(criteria["status"])
        return {"items": [asdict(r) for r in sim.request_log.find(**criteria)]}
    if parts == ["requests"] and method == "DELETE":
        sim.request_log.clear()
        return {"items": []}
    if parts == ["compact"] and method == "POST":
        sim.store.compact()
        return {"compactedResourceVersion": str(sim.store.compacted_rv)}
    raise SimApiError(404, "NotFound", _NOT_FOUND)
