"""The object verbs of the simulated API server: what GET, LIST, POST, PUT, PATCH and DELETE answer.

Why a module of its own: the request handler (:mod:`lab.apiserver.handler`) is the plumbing of a
connection (read the request, resolve its route, inject the faults, log it, write the bytes); what each
verb means on the wire is a separate concern and lives here: the store call it makes and the status it
answers with, as a real API server does (201 on create, 201 for a PUT that created, 415 for an unknown
patch media type, the object still being deleted (finalizers, a graceful pod), a ``Status`` or the
deleted object on delete).
It depends on the handler only through :class:`ObjectRequest`, as :mod:`lab.apiserver.watchstream`
depends on it through ``ChunkedResponse`` (no import cycle).
"""

from __future__ import annotations

from email.message import Message
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from lab.apiserver.faults import FaultDecision
from lab.apiserver.listing import CONTINUE_EXPIRED
from lab.apiserver.resources import JsonObj, ResourceType, SimApiError
from lab.apiserver.routing import Route, parse_int

if TYPE_CHECKING:
    from lab.apiserver.store import Store

__all__ = ["ObjectRequest", "json_body", "serve_object"]

_PATCH_TYPES = {
    "application/merge-patch+json": "merge",
    "application/strategic-merge-patch+json": "strategic",
    "application/json-patch+json": "json",
}


class ObjectRequest(Protocol):
    """`lab.apiserver.handler.SimRequestHandler` as an object verb answers through it."""

    headers: Message

    def _send_json(self, status: int, obj: Any) -> None: ...

    def _note_precondition(self, holder: Any) -> None: ...


def json_body(body: bytes, *, required: bool = True) -> Any:
    """The request's JSON body (None when empty and not `required`); 400 when it does not parse."""
    if not body.strip():
        if required:
            raise SimApiError.bad_request("the request body is empty")
        return None
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise SimApiError.bad_request(f"couldn't get version/kind; json parse error: {exc}") from None


def _write_body(req: ObjectRequest, body: bytes) -> Any:
    """The JSON body of a PUT or PATCH, noting the resourceVersion it is conditional on."""
    obj = json_body(body)
    if isinstance(obj, dict):
        req._note_precondition(obj.get("metadata"))
    return obj


def serve_object(
    req: ObjectRequest,
    store: Store,
    verb: str,
    route: Route,
    q: dict[str, str],
    body: bytes,
    decision: FaultDecision,
) -> None:
    """Answer one request of an object verb (any but ``watch``) on `route`, through the `store`."""
    rt = route.rt
    dry_run = q.get("dryRun") == "All"
    if verb == "get":
        req._send_json(200, store.get(rt, route.namespace, route.name or "", copy=False))
    elif verb == "list":
        if decision.expire and q.get("continue"):
            raise SimApiError.expired(CONTINUE_EXPIRED)
        result = store.list(
            rt,
            route.namespace,
            label_selector=q.get("labelSelector"),
            field_selector=q.get("fieldSelector"),
            limit=parse_int(q.get("limit"), "limit"),
            continue_token=q.get("continue"),
            resource_version=q.get("resourceVersion"),
            resource_version_match=q.get("resourceVersionMatch"),
            copy=False,
        )
        if not rt.custom:
            # A real kube-apiserver leaves kind and apiVersion out of the items of a built-in kind's list
            # (a custom resource's items keep them): the realapi tier, docs/real-apiserver.md.
            result = {**result, "items": [_without_type_meta(item) for item in result["items"]]}
        req._send_json(200, result)
    elif verb == "create":
        obj = store.create(rt, route.namespace, json_body(body), dry_run=dry_run, copy=False)
        req._send_json(201, obj)
    elif verb == "update":
        name = route.name or ""
        existed = route.subresource is not None or _exists(store, rt, route.namespace, name)
        obj = store.replace(
            rt,
            route.namespace,
            name,
            _write_body(req, body),
            subresource=route.subresource,
            dry_run=dry_run,
            copy=False,
        )
        req._send_json(200 if existed else 201, obj)
    elif verb == "patch":
        ctype = req.headers.get("Content-Type", "").split(";")[0].strip().lower()
        patch_type = _PATCH_TYPES.get(ctype)
        if patch_type is None:
            accepted = ", ".join(_PATCH_TYPES)
            raise SimApiError(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types "
                f"include: {accepted}",
            )
        obj = store.patch(
            rt,
            route.namespace,
            route.name or "",
            _write_body(req, body),
            patch_type=patch_type,
            subresource=route.subresource,
            dry_run=dry_run,
            copy=False,
        )
        req._send_json(200, obj)
    else:
        opts = json_body(body, required=False) or {}
        if not isinstance(opts, dict):
            raise SimApiError.bad_request("DeleteOptions must be a JSON object")
        dry_run = dry_run or "All" in (opts.get("dryRun") or [])
        req._note_precondition(opts.get("preconditions"))
        grace = opts.get("gracePeriodSeconds", q.get("gracePeriodSeconds"))
        obj = store.delete(
            rt,
            route.namespace,
            route.name or "",
            preconditions=opts.get("preconditions"),
            grace_period_seconds=None if grace is None else parse_int(str(grace), "gracePeriodSeconds"),
            dry_run=dry_run,
            copy=False,
        )
        meta = obj.get("metadata") or {}
        if meta.get("finalizers") or meta.get("deletionGracePeriodSeconds"):
            req._send_json(
                200, obj
            )  # not gone yet (finalizers, a graceful pod): the object, 200 as the real server
        elif rt.returns_deleted:
            req._send_json(200, obj)
        else:
            details = {"name": meta.get("name"), "kind": rt.plural, "uid": meta.get("uid")}
            if rt.group:
                details["group"] = rt.group
            success = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}
            req._send_json(200, success | {"details": details})


def _exists(store: Store, rt: ResourceType, namespace: str | None, name: str) -> bool:
    try:
        store.get(rt, namespace, name, copy=False)
    except SimApiError:
        return False
    return True


_TYPE_META = frozenset({"kind", "apiVersion"})


def _without_type_meta(obj: JsonObj) -> JsonObj:
    """`obj` (a stored object, never mutated) without its kind and apiVersion."""
    return {k: v for k, v in obj.items() if k not in _TYPE_META}
