"""managedFields for the simulated pods (`lab.cluster.podshape`): the FieldsV1 set of a manager's fields and
one managedFields entry, as kube-apiserver records them (merge keys per list, `k:{…}` items).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

JsonObj = dict[str, Any]

#: The merge keys of the lists in a pod (a list not named here is atomic: owned as one field).
_LIST_KEYS: dict[str, tuple[str, ...]] = {
    "containers": ("name",),
    "initContainers": ("name",),
    "env": ("name",),
    "ports": ("containerPort", "protocol"),
    "volumes": ("name",),
    "volumeMounts": ("mountPath",),
    "conditions": ("type",),
    "podIPs": ("ip",),
    "hostIPs": ("ip",),
    "ownerReferences": ("uid",),
}


def fields_v1(obj: Mapping[str, Any]) -> JsonObj:
    """The FieldsV1 set of an object's fields (what managedFields records of a manager that set them)."""
    return {f"f:{k}": fields_of(k, v, top=True) for k, v in obj.items()}


def fields_of(key: str, value: Any, top: bool = False) -> JsonObj:
    if isinstance(value, Mapping):
        inner: JsonObj = {} if top else {".": {}}
        inner.update({f"f:{k}": fields_of(k, v) for k, v in value.items()})
        return inner
    if isinstance(value, list) and key in _LIST_KEYS and all(isinstance(i, Mapping) for i in value):
        out: JsonObj = {".": {}}
        for item in value:
            ident = {k: item[k] for k in _LIST_KEYS[key] if k in item}
            out[f"k:{json.dumps(ident, separators=(',', ':'))}"] = fields_of("", item)
        return out
    return {}


def condition_fields() -> JsonObj:
    return {".": {}, "f:lastProbeTime": {}, "f:lastTransitionTime": {}, "f:status": {}, "f:type": {}}


def entry(manager: str, time: str, fields: JsonObj, subresource: str | None = None) -> JsonObj:
    entry: JsonObj = {
        "manager": manager,
        "operation": "Update",
        "apiVersion": "v1",
        "time": time,
        "fieldsType": "FieldsV1",
        "fieldsV1": fields,
    }
    if subresource:
        entry["subresource"] = subresource
    return entry


def kubelet_fields(status: Mapping[str, Any]) -> JsonObj:
    """The kubelet's part of the status (all but the scheduler's PodScheduled and the IPs, added per pod)."""
    kept = {k: v for k, v in status.items() if k not in ("podIP", "podIPs", "hostIP", "hostIPs")}
    fields = fields_v1({"status": kept})
    conditions = fields["f:status"].get("f:conditions")
    if conditions is not None:
        conditions.pop('k:{"type":"PodScheduled"}', None)
    return fields
