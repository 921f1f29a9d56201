"""What each ipamgc component called on the real API server, from kube-apiserver's audit log, against
what deploy/rbac.yaml grants it.

A call is (verb, group, resource, namespace, name), read from the audit event's `objectRef`, by the
identity that made it (`user.username`).  A `Recorder` gathers the calls of the whole session (every
cluster's audit log) so the tier's last test can check both ways: every call was allowed (RBAC answered
no 403) and every granted (group, resource, verb) was used — or print what was not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from lab.realapi import DEPLOY, RealCluster

#: identity (the token's uid, lab/realapi.py) → component in the report
COMPONENTS = {"watcher": "watch", "leader": "lead", "release": "release", "check": "check"}


@dataclass(frozen=True, order=True)
class Call:
    verb: str
    group: str
    resource: str
    namespace: str
    name: str
    code: int


def call_of(event: dict[str, Any]) -> tuple[str, Call] | None:
    who = COMPONENTS.get((event.get("user") or {}).get("uid", ""))
    ref = event.get("objectRef")
    if who is None:
        return None
    if not ref or event.get("stage") not in ("ResponseComplete", "Panic"):
        return None  # discovery (/apis, /api) has no objectRef: no rule needed
    resource = ref.get("resource", "")
    if ref.get("subresource"):
        resource += "/" + ref["subresource"]
    code = int((event.get("responseStatus") or {}).get("code") or 0)
    call = Call(
        event["verb"], ref.get("apiGroup", ""), resource, ref.get("namespace", ""), ref.get("name", ""), code
    )
    return who, call


@dataclass
class Recorder:
    calls: dict[str, set[Call]] = field(default_factory=dict)

    def collect(self, cluster: RealCluster) -> None:
        for event in cluster.audit_events():
            got = call_of(event)
            if got is not None:
                self.calls.setdefault(got[0], set()).add(got[1])


def granted(service_account: str | None = None, cluster_role: str | None = None) -> set[tuple[str, str, str]]:
    """Every (group, resource, verb) deploy/rbac.yaml grants a ServiceAccount (through its bindings) or
    one ClusterRole."""
    docs = [d for d in yaml.safe_load_all((DEPLOY / "rbac.yaml").read_text()) if d]
    roles: list[dict[str, Any]] = []
    if cluster_role is not None:
        roles = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == cluster_role]
    for binding in (d for d in docs if d["kind"] in ("ClusterRoleBinding", "RoleBinding")):
        if any(
            s.get("kind") == "ServiceAccount" and s["name"] == service_account for s in binding["subjects"]
        ):
            ref = binding["roleRef"]
            roles += [d for d in docs if d["kind"] == ref["kind"] and d["metadata"]["name"] == ref["name"]]
    out: set[tuple[str, str, str]] = set()
    for role in roles:
        for rule in role["rules"]:
            for g in rule.get("apiGroups", []):
                for r in rule.get("resources", []):
                    for v in rule.get("verbs", []):
                        out.add((g, r, v))
    return out
