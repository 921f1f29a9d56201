"""What every leader-side writer needs from the API for Calico's objects: the protocol, the plural names,
and Calico's compare-and-delete.

Its own module because the leader's writers share it — the releases (`workers.leader.release`,
`workers.leader.handle_count`), the node and empty-block cleanup (`workers.leader.cleanup`), the cooldown
(`workers.leader.cooldown`) — and the live re-check (`workers.leader.recheck`) reads through the same
protocol: none of them should depend on another writer's module for the API's shape.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from kubeio.errors import Conflict, NotFound
from shared import blockops
from shared.calicogroup import CalicoGroup
from workers.leader.kube import JsonObj

log = logging.getLogger("workers.calico_objects")  # its pre-split name (#37): log lines unchanged

# libcalico-go's `datastoreRetries`: compare-and-swap attempts per object before giving up.
MAX_CAS_ATTEMPTS = 100
BLOCKS = "ipamblocks"
HANDLES = "ipamhandles"
VMS = "virtualmachines"  # kubevirt.io/v1
VMIS = "virtualmachineinstances"


class ObjectApi(Protocol):
    """What the leader needs from the API (`workers.leader.kube.CalicoApi`)."""

    def get(self, plural: str, name: str) -> JsonObj: ...
    def replace(self, plural: str, body: JsonObj) -> JsonObj: ...
    def delete(self, plural: str, name: str, uid: str, resource_version: str) -> None: ...
    def create(self, plural: str, body: JsonObj) -> JsonObj: ...
    def list_page(self, plural: str, limit: int, cont: str = "") -> tuple[list[JsonObj], str]: ...
    def list(self, plural: str, label_selector: str) -> list[JsonObj]: ...
    def calico(self) -> CalicoGroup: ...
    def get_node(self, name: str) -> JsonObj: ...
    def get_pod(self, namespace: str, name: str) -> JsonObj: ...
    def kubevirt_installed(self) -> bool: ...
    def get_kubevirt(self, plural: str, namespace: str, name: str) -> JsonObj: ...


def soft_delete_and_delete(api: ObjectApi, plural: str, obj: JsonObj, guard: Callable[[], None]) -> None:
    """Calico's compare-and-delete on Kubernetes: `deleted: true` under resourceVersion CAS, then delete
    by uid + the resourceVersion of that write.  Conflict/NotFound propagate to the caller's retry."""
    body = blockops.json_copy(obj)
    body["spec"]["deleted"] = True
    guard()
    written = api.replace(plural, body)
    meta = written.get("metadata") or {}
    name = str(meta.get("name") or obj["metadata"]["name"])
    guard()
    try:
        api.delete(plural, name, str(meta.get("uid") or ""), str(meta.get("resourceVersion") or ""))
    except NotFound:
        pass  # already gone: what we wanted
    except Conflict:
        # Written between our two calls: the soft-deleted object is already absent to every reader.
        log.warning("%s/%s changed after its soft delete; left soft-deleted", plural, name)
