"""The simulated kube-apiserver: a store with versions, watch history and paginated snapshots, served over
real HTTP with a real API server's semantics, faults injected on demand.

Owns the store and its storage (`store`, `storage`, `history`, `listing`, `lifecycle`, `deletion`,
`patch`, `validation`, `selectors`, `resources`), in-process and HTTP watches (`watch`, `watchstream`),
the HTTP side (`apiserver`, `handler`, `routing`, `verbs`, `discovery`, `serving`, `control`), fault
injection (`faults`) and the request log (`requestlog`).

May import: `shared`'s pure modules only (Calico's API group names) and the `kubernetes` client (a
client configured for the server).  Nothing else of the product, nor of the lab (import-linter's
contract): it is the cluster's API, not its workload.

The API server pieces are exported lazily (``from lab.apiserver import SimApiServer``) so that
importing the store alone does not pull in the HTTP server and the kubernetes client.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lab.apiserver.apiserver import RequestRecord, SimApiServer
    from lab.apiserver.faults import FaultInjector, FaultRule
    from lab.apiserver.store import RESOURCES, ResourceType, SimApiError, Store

__all__ = [
    "RESOURCES",
    "FaultInjector",
    "FaultRule",
    "RequestRecord",
    "ResourceType",
    "SimApiError",
    "SimApiServer",
    "Store",
]

_EXPORTS = {
    "RESOURCES": "lab.apiserver.store",
    "ResourceType": "lab.apiserver.store",
    "SimApiError": "lab.apiserver.store",
    "Store": "lab.apiserver.store",
    "FaultInjector": "lab.apiserver.faults",
    "FaultRule": "lab.apiserver.faults",
    "RequestRecord": "lab.apiserver.apiserver",
    "SimApiServer": "lab.apiserver.apiserver",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
