"""Routing of the simulated API server: REST paths to resources, HTTP methods to verbs.

The Kubernetes REST layout (``/api/v1/namespaces/{ns}/pods/{name}/status``,
``/apis/{group}/{version}/{plural}``, the legacy ``/watch/`` prefix) is resolved here
against the store's :class:`~lab.apiserver.resources.Registry`, without touching HTTP, so
the request handler only has to act on a :class:`Route` and a verb. Query parameters
are parsed with the real server's leniency and error messages.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from lab.apiserver.resources import Registry, ResourceType, SimApiError

__all__ = ["Route", "parse_bool", "parse_int", "resolve", "verb_for"]


@dataclass(frozen=True, slots=True)
class Route:
    """Where a request goes: resource, namespace, name, subresource, and whether it is a watch path."""

    rt: ResourceType
    namespace: str | None
    name: str | None
    subresource: str | None
    watch_path: bool


def parse_bool(value: str | None, param: str) -> bool:
    """A boolean query parameter as Go's strconv.ParseBool reads it; unset is False."""
    if value is None or value == "":
        return False
    if value in ("1", "t", "T", "true", "TRUE", "True"):
        return True
    if value in ("0", "f", "F", "false", "FALSE", "False"):
        return False
    raise SimApiError.bad_request(f'invalid value for {param}: "{value}"')


def parse_int(value: str | None, param: str) -> int | None:
    """An integer query parameter; None if unset."""
    if value in (None, ""):
        return None
    try:
        return int(str(value))
    except ValueError:
        raise SimApiError.bad_request(f'invalid value for {param}: "{value}"') from None


def resolve(registry: Registry, parts: list[str]) -> Route | None:
    """The resource a REST path names, or None if it names nothing served."""
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    watch_path = bool(rest) and rest[0] == "watch"
    if watch_path:
        rest = rest[1:]
    lookup = registry.lookup
    namespace: str | None = None
    nested = lookup(group, version, rest[2]) if len(rest) >= 3 and rest[0] == "namespaces" else None
    if nested is not None and nested.namespaced:
        rt, namespace, tail = nested, rest[1], rest[3:]
    elif rest and (top := lookup(group, version, rest[0])) is not None:
        rt, tail = top, rest[1:]
        if rt.namespaced and tail:
            return None
    else:
        return None
    if len(tail) > 2 or (len(tail) == 2 and tail[1] not in rt.subresources):
        return None
    name = tail[0] if tail else None
    return Route(rt, namespace, name, tail[1] if len(tail) == 2 else None, watch_path)


def verb_for(method: str, route: Route, query: Mapping[str, str]) -> str:
    """The Kubernetes verb of ``method`` on ``route``; 405 if the method is not allowed there."""
    named = route.name is not None
    watch = route.watch_path or parse_bool(query.get("watch"), "watch")
    verb = {
        "GET": "watch" if watch else "get" if named else "list",
        "POST": None if named else "create",
        "PUT": "update" if named else None,
        "PATCH": "patch" if named else None,
        "DELETE": "delete" if named else None,
    }.get(method)
    if verb is None or (route.subresource and verb not in ("get", "update", "patch")):
        raise SimApiError(
            405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
        )
    if verb == "create" and route.rt.namespaced and route.namespace is None:
        raise SimApiError(
            405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
        )
    return verb
