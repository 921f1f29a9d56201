"""The server-managed part of an object's life: what create stamps, update keeps, delete checks.

A real API server owns some of every object's metadata: it sets ``uid``,
``creationTimestamp`` and ``generation`` (and a name from ``generateName``) on create,
refuses a client-set ``resourceVersion`` there, keeps those fields (and a pending
``deletionTimestamp``) across a PUT whatever the client sent, bumps ``generation`` only
when something outside metadata (and status) changes, lets a ``/status`` write touch
nothing but status, and checks DELETE preconditions. It also decides whether an update may
go ahead (optimistic concurrency, and resources such as leases that refuse unconditional
updates). These rules are pure functions on JSON objects, kept out of
:mod:`lab.apiserver.store`, which only sequences them under its lock and commits the result.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any

from lab.apiserver.resources import JsonObj, Key, ResourceType, SimApiError
from lab.apiserver.validation import parse_rv, rv_of

__all__ = [
    "admission_refusal",
    "build_update",
    "check_delete_preconditions",
    "check_typed_fields",
    "check_update_precondition",
    "check_update_target",
    "deletion_grace",
    "generate_name",
    "namespace_defaults",
    "pod_qos_class",
    "prepare_create",
    "service_account_name",
    "should_delete_on_update",
    "spec_changed",
    "stamp_new",
]

_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_CONFLICT = "the object has been modified; please apply your changes to the latest version and try again"
#: Metadata a PUT cannot change: the server keeps the stored values.
_KEPT_ON_UPDATE = ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds")


def prepare_create(rt: ResourceType, obj: JsonObj, namespace: str | None) -> None:
    """Normalise a create body in place: namespace from the URL, type, no deletion state."""
    meta = obj["metadata"]
    if rt.namespaced:
        meta["namespace"] = namespace or meta.get("namespace") or ""
        if not meta["namespace"]:
            raise SimApiError.bad_request("namespace is required for namespaced resources")
    else:
        meta.pop("namespace", None)
    if meta.get("resourceVersion"):
        raise SimApiError(500, "InternalError", "resourceVersion should not be set on objects to be created")
    obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
    for stale in ("deletionTimestamp", "deletionGracePeriodSeconds"):
        meta.pop(stale, None)


#: Pod phases whose pods are deleted at once, whatever grace period was asked.
_FINISHED = frozenset({"Succeeded", "Failed"})
#: `spec.terminationGracePeriodSeconds` when a pod does not set it (what the real server defaults it to).
DEFAULT_TERMINATION_GRACE = 30


def pod_qos_class(spec: Mapping[str, Any]) -> str:
    """The pod's QoS class as the real server computes it on create (Kubernetes' ``GetPodQOS``).

    Only cpu and memory count.  BestEffort: no container requests or limits either; Guaranteed: every
    container limits both, and its requests (defaulted to its limits when unset) equal the limits;
    Burstable otherwise.
    """
    any_set = False
    guaranteed = True
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    for c in containers:
        res = (c.get("resources") or {}) if isinstance(c, dict) else {}
        limits = {
            k: v for k, v in (res.get("limits") or {}).items() if k in ("cpu", "memory") and v not in ("0", 0)
        }
        requests = {
            k: v
            for k, v in (res.get("requests") or {}).items()
            if k in ("cpu", "memory") and v not in ("0", 0)
        }
        any_set = any_set or bool(limits) or bool(requests)
        if set(limits) != {"cpu", "memory"} or any(requests.get(k, v) != v for k, v in limits.items()):
            guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed and containers else "Burstable"


def deletion_grace(obj: Mapping[str, Any], requested: int | None) -> int:
    """The grace period a pod's DELETE gets (Kubernetes' pod strategy ``CheckGracefulDelete``).

    The one asked for, or the pod's ``terminationGracePeriodSeconds`` (30 when unset); 0 for a pod not
    bound to a node or already finished; 1 for a negative one.
    """
    spec = obj.get("spec") or {}
    period = requested if requested is not None else spec.get("terminationGracePeriodSeconds")
    period = DEFAULT_TERMINATION_GRACE if period is None else int(period)
    if not spec.get("nodeName") or (obj.get("status") or {}).get("phase") in _FINISHED:
        return 0
    return 1 if period < 0 else period


def should_delete_on_update(old_meta: Mapping[str, Any], new_meta: Mapping[str, Any]) -> bool:
    """Whether an update removes the object (``ShouldDeleteDuringUpdate``): it is being deleted with no
    grace period left and the update took its last finalizer away."""
    return (
        bool(old_meta.get("deletionTimestamp"))
        and old_meta.get("deletionGracePeriodSeconds") == 0
        and not new_meta.get("finalizers")
    )


def namespace_defaults(obj: JsonObj) -> None:
    """What the real server sets on a new Namespace: the name label, the `kubernetes` finalizer, Active."""
    meta = obj["metadata"]
    meta["labels"] = {**(meta.get("labels") or {}), "kubernetes.io/metadata.name": meta["name"]}
    given = obj.get("spec")
    spec: JsonObj = given if isinstance(given, dict) else {}
    obj["spec"] = {**spec, "finalizers": spec.get("finalizers") or ["kubernetes"]}
    obj["status"] = {"phase": "Active"}


def admission_refusal(
    rt: ResourceType,
    obj: Mapping[str, Any],
    namespace: Mapping[str, Any] | None,
    service_account: Mapping[str, Any] | None,
) -> SimApiError | None:
    """Why the real server's admission refuses to create ``obj`` (None: it does not).

    ``NamespaceLifecycle``: a namespaced object needs its namespace (404) and one not being deleted (403).
    ``ServiceAccount``: a pod needs its service account (``default`` unless it names one; 403).
    ``namespace``/``service_account``: the stored objects, None when absent (a store that serves no
    service accounts passes the namespace again: any non-None value admits).
    """
    meta = obj["metadata"]
    name, ns = str(meta.get("name") or ""), str(meta.get("namespace") or "")
    if namespace is None:
        return SimApiError(
            404, "NotFound", f'namespaces "{ns}" not found', details={"name": ns, "kind": "namespaces"}
        )
    if namespace["metadata"].get("deletionTimestamp"):
        why = f"namespace {ns} is being terminated"
        cause = {"reason": "NamespaceTerminating", "message": why, "field": "metadata.namespace"}
        return SimApiError(
            403,
            "Forbidden",
            f'{rt.qualified} "{name}" is forbidden: unable to create new content in namespace {ns} '
            "because it is being terminated",
            details={"name": name, "kind": rt.plural, "causes": [cause]},
        )
    if rt.plural == "pods" and service_account is None:
        sa = service_account_name(obj)
        return SimApiError(
            403,
            "Forbidden",
            f'pods "{name}" is forbidden: error looking up service account {ns}/{sa}: '
            f'serviceaccount "{sa}" not found',
            details={"name": name, "kind": "pods"},
        )
    return None


def service_account_name(obj: Mapping[str, Any]) -> str:
    """The service account a pod runs as (``default`` unless it names one)."""
    spec = obj.get("spec") or {}
    return str(spec.get("serviceAccountName") or spec.get("serviceAccount") or "default")


def check_typed_fields(rt: ResourceType, name: str, obj: JsonObj) -> None:
    """422 Invalid when a field the CRD's schema types holds another JSON type (absent is fine)."""
    for path, typ in rt.typed_fields:
        node: Any = obj
        for step in path.split("."):
            node = node.get(step) if isinstance(node, dict) else None
        if node is not None and type(node) is not typ:
            want = "boolean" if typ is bool else "string" if typ is str else typ.__name__
            raise SimApiError.invalid(
                rt,
                name,
                path,
                f'Invalid value: "{type(node).__name__}": {path} in body must be of type {want}',
            )


def generate_name(prefix: str, rng: random.Random, taken: Callable[[str], bool]) -> str:
    """``metadata.generateName``: the prefix plus a random suffix, avoiding taken names if it can."""
    name = ""
    for _ in range(16):
        suffix = "".join(rng.choice(_GENERATE_ALPHABET) for _ in range(5))
        name = prefix[:58] + suffix
        if not taken(name):
            break
    return name


def stamp_new(meta: JsonObj, uid: str, now: str) -> None:
    """The metadata the server sets on every new object."""
    meta["uid"] = uid
    meta["creationTimestamp"] = now
    meta["generation"] = 1


def check_update_target(rt: ResourceType, key: Key, name: str, meta: JsonObj) -> None:
    """400 unless the body's name and namespace (if set) match the URL's."""
    if meta.get("name") and meta["name"] != name:
        raise SimApiError.bad_request(
            f"the name of the object ({meta['name']}) does not match the name on the URL ({name})"
        )
    if rt.namespaced and meta.get("namespace") and meta["namespace"] != key[0]:
        raise SimApiError.bad_request(
            "the namespace of the provided object does not match the namespace sent on the request"
        )


def check_update_precondition(rt: ResourceType, name: str, want_rv: str, old: JsonObj) -> None:
    """Optimistic concurrency for an update of ``old`` by a body carrying ``want_rv``.

    A stale version is 409 Conflict. No version at all overwrites, unless the resource's
    strategy forbids unconditional updates (leases): then it is 422 Invalid, as from the
    real generic registry (``AllowUnconditionalUpdate() == false``).
    """
    if want_rv:
        parse_rv(want_rv)
        if want_rv != rv_of(old):
            raise SimApiError.conflict(rt, name, _CONFLICT)
    elif not rt.unconditional_update:
        why = "Invalid value: 0x0: must be specified for an update"
        details: JsonObj = {"name": name, "kind": rt.plural}
        if rt.group:
            details["group"] = rt.group
        details["causes"] = [
            {"reason": "FieldValueInvalid", "message": why, "field": "metadata.resourceVersion"}
        ]
        message = f'{rt.qualified} "{name}" is invalid: metadata.resourceVersion: {why}'
        raise SimApiError(422, "Invalid", message, details=details)


def spec_changed(rt: ResourceType, old: JsonObj, new: JsonObj) -> bool:
    """Whether an update bumps ``metadata.generation``: anything but metadata (and status) changed."""
    skip = {"metadata", "status"} if "status" in rt.subresources else {"metadata"}
    keys = (set(old) | set(new)) - skip
    return any(old.get(k) != new.get(k) for k in keys)


def build_update(
    rt: ResourceType, key: Key, name: str, old: JsonObj, obj: JsonObj, subresource: str | None
) -> JsonObj:
    """The object an update of ``old`` with body ``obj`` stores (still at ``old``'s version).

    A ``status`` write takes only the body's status; a main-resource write takes the body
    but keeps the server-managed metadata and bumps ``generation`` if the spec changed.
    """
    old_meta = old["metadata"]
    if subresource == "status":
        new = {**old, "metadata": dict(old_meta)}
        if "status" in obj:
            new["status"] = obj["status"]
        else:
            new.pop("status", None)
    else:
        meta = obj["metadata"]
        new = {**obj, "apiVersion": rt.api_version, "kind": rt.kind}
        new["metadata"] = meta
        meta["name"] = name
        if rt.namespaced:
            meta["namespace"] = key[0]
        else:
            meta.pop("namespace", None)
        for kept in _KEPT_ON_UPDATE:
            if kept in old_meta:
                meta[kept] = old_meta[kept]
            else:
                meta.pop(kept, None)
        generation = int(old_meta.get("generation") or 1)
        meta["generation"] = generation + 1 if spec_changed(rt, old, new) else generation
    new["metadata"]["resourceVersion"] = old_meta.get("resourceVersion")
    return new


def check_delete_preconditions(
    rt: ResourceType, name: str, meta: JsonObj, preconditions: Mapping[str, Any] | None
) -> None:
    """409 Conflict if DeleteOptions preconditions (uid, resourceVersion) do not hold."""
    pre = preconditions or {}
    if pre.get("uid") and pre["uid"] != meta.get("uid"):
        why = f"Precondition failed: UID in precondition: {pre['uid']}, UID in object meta: {meta.get('uid')}"
        raise SimApiError.conflict(rt, name, why)
    if pre.get("resourceVersion") and str(pre["resourceVersion"]) != meta.get("resourceVersion"):
        why = (
            f"Precondition failed: ResourceVersion in precondition: {pre['resourceVersion']}, "
            f"ResourceVersion in object meta: {meta.get('resourceVersion')}"
        )
        raise SimApiError.conflict(rt, name, why)
