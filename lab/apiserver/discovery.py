"""API discovery for the simulated API server: the documents clients read before anything else.

``kubectl``, the dynamic client and informers first ask the server what it serves
(``/api``, ``/apis``, ``/apis/{group}``, ``/api/v1``, ``/apis/{group}/{version}``,
``/version``). The answers are derived from the store's
:class:`~lab.apiserver.resources.Registry`, so a resource added there is discoverable
without touching this module.
"""

from __future__ import annotations

import base64
import hashlib
from typing import TYPE_CHECKING

from lab.apiserver.resources import JsonObj
from lab.apiserver.serving import Server

if TYPE_CHECKING:
    from lab.apiserver.store import Store

__all__ = ["discovery_document"]

_VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]


def discovery_document(sim: Server, parts: list[str]) -> JsonObj | None:
    """The discovery document at the path ``parts``, or None if it is not a discovery path."""
    doc: JsonObj | None = None
    if parts == ["version"]:
        doc = sim.version_info()
    elif parts == ["api"]:
        doc = {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": sim.address}],
        }
    elif parts == ["apis"]:
        groups = [
            _api_group(sim.store, g)
            for g in dict.fromkeys(g for g, _ in sim.store.registry.group_versions())
            if g
        ]
        doc = {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
    elif len(parts) == 2 and parts[0] == "apis" and _api_group(sim.store, parts[1])["versions"]:
        doc = _api_group(sim.store, parts[1]) | {"kind": "APIGroup", "apiVersion": "v1"}
    elif (len(parts) == 2 and parts[0] == "api") or (len(parts) == 3 and parts[0] == "apis"):
        group, version = ("", parts[1]) if parts[0] == "api" else (parts[1], parts[2])
        doc = _resource_list(sim.store, group, version)
    return doc


def _api_group(store: Store, group: str) -> JsonObj:
    versions = [
        {"groupVersion": f"{g}/{v}", "version": v} for g, v in store.registry.group_versions() if g == group
    ]
    return {"name": group, "versions": versions, "preferredVersion": versions[0] if versions else {}}


def _resource_list(store: Store, group: str, version: str) -> JsonObj | None:
    rts = store.registry.in_group_version(group, version)
    if not rts:
        return None
    resources: list[JsonObj] = []
    for rt in rts:
        digest = hashlib.sha256(f"{rt.api_version}/{rt.kind}".encode()).digest()[:8]
        entry: JsonObj = {
            "name": rt.plural,
            "singularName": rt.kind.lower(),
            "namespaced": rt.namespaced,
            "kind": rt.kind,
            "verbs": _VERBS,
            "storageVersionHash": base64.b64encode(digest).decode(),
        }
        if rt.short_names:
            entry["shortNames"] = list(rt.short_names)
        resources.append(entry)
        for sub in rt.subresources:
            resources.append(
                {
                    "name": f"{rt.plural}/{sub}",
                    "singularName": "",
                    "namespaced": rt.namespaced,
                    "kind": rt.kind,
                    "verbs": ["get", "patch", "update"],
                }
            )
    group_version = f"{group}/{version}" if group else version
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    }
