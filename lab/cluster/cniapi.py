"""What the simulated Calico CNI needs of the API it writes through, and how it reads the API's errors.

Why a module of its own: the CNI's IPAM assignment (:mod:`lab.cluster.cni`) and its IPAMHandle
bookkeeping (:mod:`lab.cluster.cnihandles`) both write with compare-and-swap retries through the same
narrow interface, and neither may depend on the store itself (it is handed in: the simulated cluster's
store in-process, anything with the same REST semantics otherwise).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

__all__ = ["MAX_CAS_ATTEMPTS", "ApiError", "JsonObj", "ObjectApi", "error_code", "soft_delete"]

#: How often libcalico-go retries a write that lost a resourceVersion race.
MAX_CAS_ATTEMPTS = 100
JsonObj = dict[str, Any]


class ApiError(Protocol):
    code: int


class ObjectApi(Protocol):
    """The subset of the simulated API store the plugin needs (same semantics as the REST verbs)."""

    def get(self, resource: str, namespace: str | None, name: str) -> JsonObj: ...
    def create(self, resource: str, namespace: str | None, body: Mapping[str, Any]) -> JsonObj: ...
    def replace(
        self, resource: str, namespace: str | None, name: str, body: Mapping[str, Any]
    ) -> JsonObj: ...
    def delete(
        self,
        resource: str,
        namespace: str | None,
        name: str,
        *,
        preconditions: Mapping[str, Any] | None = None,
    ) -> JsonObj: ...


def error_code(exc: Exception) -> int:
    """The HTTP status of an API error (0 when it has none)."""
    return int(getattr(exc, "code", 0))


def soft_delete(api: ObjectApi, resource: str, obj: JsonObj) -> None:
    """Delete a cluster-scoped IPAM object as libcalico-go does: mark it `spec.deleted` (a replace at its
    resourceVersion), then delete it on the condition that it is still exactly what that write made."""
    name = obj["metadata"]["name"]
    obj["spec"]["deleted"] = True
    soft = api.replace(resource, None, name, obj)
    preconditions = {
        "uid": obj["metadata"].get("uid"),
        "resourceVersion": soft["metadata"]["resourceVersion"],
    }
    api.delete(resource, None, name, preconditions=preconditions)
