"""Checks and parsing of what a request hands the store: names, bodies, versions, selectors.

The API server rejects malformed input with the same errors whichever verb carries it
(an invalid name is 422 on create and on create-on-update; a bad resourceVersion or
selector is 400 on list and on watch), so these checks live here once, as plain functions,
rather than inside each store method. :class:`ObjectFilter` is the parsed form of a
namespace plus label and field selectors, shared by LIST and WATCH.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lab.apiserver.resources import JsonObj, ResourceType, SimApiError, deep_copy
from lab.apiserver.selectors import (
    FieldSelector,
    LabelSelector,
    SelectorError,
    parse_field_selector,
    parse_label_selector,
)

__all__ = [
    "ObjectFilter",
    "parse_rv",
    "parse_selectors",
    "request_body",
    "rv_of",
    "validate_name",
]

_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(slots=True)
class ObjectFilter:
    """Which objects a LIST or WATCH selects: a namespace (None: all) and two selectors."""

    namespace: str | None
    labels: LabelSelector
    fields: FieldSelector

    def __call__(self, obj: JsonObj) -> bool:
        meta = obj.get("metadata") or {}
        if self.namespace is not None and meta.get("namespace", "") != self.namespace:
            return False
        return self.labels.matches(meta.get("labels")) and self.fields.matches(obj)


def parse_selectors(
    rt: ResourceType, labels: str | None, fields: str | None
) -> tuple[LabelSelector, FieldSelector]:
    """Parse a labelSelector and a fieldSelector for ``rt``; 400 BadRequest if malformed."""
    try:
        return parse_label_selector(labels), parse_field_selector(fields, rt.selectable)
    except SelectorError as exc:
        raise SimApiError.bad_request(str(exc)) from None


def rv_of(obj: Mapping[str, Any]) -> str:
    """An object's ``metadata.resourceVersion`` ("" if it has none)."""
    meta = obj.get("metadata")
    return str(meta.get("resourceVersion") or "") if isinstance(meta, Mapping) else ""


def parse_rv(value: str | None, what: str = "resource version") -> int | None:
    """A resourceVersion as an int (None if unset); 400 BadRequest if not a version."""
    if value in (None, ""):
        return None
    try:
        rv = int(str(value))
    except ValueError:
        raise SimApiError.bad_request(f"invalid {what}: {value}") from None
    if rv < 0:
        raise SimApiError.bad_request(f"invalid {what}: {value}")
    return rv


def validate_name(rt: ResourceType, name: str) -> None:
    """422 Invalid unless ``name`` is a DNS subdomain (or, for some resources, a DNS label)."""
    regex, limit = (_LABEL_RE, 63) if rt.dns_label_names else (_SUBDOMAIN_RE, 253)
    if len(name) > limit or not regex.match(name):
        what = "RFC 1123 label" if rt.dns_label_names else "RFC 1123 subdomain"
        why = (
            f'Invalid value: "{name}": a lowercase {what} must consist of lower case '
            "alphanumeric characters, '-' or '.', and must start and end with an "
            "alphanumeric character"
        )
        raise SimApiError.invalid(rt, name, "metadata.name", why)


def request_body(body: Any) -> JsonObj:
    """A private copy of a write's body, with its own ``metadata`` dict; 400 if not an object."""
    if not isinstance(body, dict):
        raise SimApiError.bad_request("the body of the request must be a JSON object")
    obj: JsonObj = deep_copy(body)
    if not isinstance(obj.get("metadata", {}), dict):
        raise SimApiError.bad_request("metadata must be an object")
    obj["metadata"] = dict(obj.get("metadata") or {})
    return obj
