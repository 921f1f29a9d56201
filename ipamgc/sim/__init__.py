"""The simulated cluster: a Kubernetes API server and a Calico CNI that leaks on purpose.

The API server pieces are exported lazily (``from ipamgc.sim import SimApiServer``) so that
importing the IPAM model alone does not pull in the HTTP server and the kubernetes client.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ipamgc.sim.apiserver import RequestRecord, SimApiServer
    from ipamgc.sim.faults import FaultInjector, FaultRule
    from ipamgc.sim.store import RESOURCES, ResourceType, SimApiError, Store

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
    "RESOURCES": "ipamgc.sim.store",
    "ResourceType": "ipamgc.sim.store",
    "SimApiError": "ipamgc.sim.store",
    "Store": "ipamgc.sim.store",
    "FaultInjector": "ipamgc.sim.faults",
    "FaultRule": "ipamgc.sim.faults",
    "RequestRecord": "ipamgc.sim.apiserver",
    "SimApiServer": "ipamgc.sim.apiserver",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
