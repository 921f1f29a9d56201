"""Which API group holds Calico's objects, and the little that differs between the two groups.

Why a module: Calico 3.33 keeps its objects either in the `crd.projectcalico.org/v1` CRDs (every release
until now) or, on a cluster installed with them, in native `projectcalico.org/v3` CRDs.  libcalico-go
chooses once per process (`UsingV3CRDs`, libcalico-go/lib/backend/k8s/discovery.go): the configured
`CALICO_API_GROUP` when set, else `projectcalico.org/v3` when the API server serves that group and not
`crd.projectcalico.org/v1` (both served means an aggregated v3 API in front of the v1 CRDs: use v1
directly), else `crd.projectcalico.org/v1`.  Every read, watch and write of ipamgc goes through one
`CalicoGroup` chosen the same way (`choose`), so no other module names a group.

What differs (api/pkg/apis/projectcalico/v3 against libcalico-go/lib/apis/internalapi):
- IPAMConfig is kind `IPAMConfig`, resource `ipamconfigs` in v1, and kind `IPAMConfiguration`, resource
  `ipamconfigurations` in v3 (same spec, same `ipCooldownSeconds`);
- BlockAffinity `spec.deleted` is a string in v1 (`"true"`/`"false"`, its CRD says `type: string`) and a
  boolean in v3 (`type: boolean`; a string is refused);
- everything ipamgc reads of IPAMBlocks, IPAMHandles, KubeControllersConfigurations,
  ClusterInformations, IPPools and IPReservations has the same JSON in both.

Inside ipamgc a Calico resource is always named by its v1 plural (`ipamconfigs`); `plural()` and
`kind()` give what the chosen group serves.  Pure: no I/O (the adapters fetch `/apis` themselves).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from shared.errors import ConfigError

V1_GROUP_NAME = "crd.projectcalico.org"
V3_GROUP_NAME = "projectcalico.org"

# v1 plural → (v1 kind, v3 plural, v3 kind), for every Calico resource ipamgc reads or writes.
_RESOURCES: dict[str, tuple[str, str, str]] = {
    "ipamblocks": ("IPAMBlock", "ipamblocks", "IPAMBlock"),
    "ipamhandles": ("IPAMHandle", "ipamhandles", "IPAMHandle"),
    "blockaffinities": ("BlockAffinity", "blockaffinities", "BlockAffinity"),
    "ipamconfigs": ("IPAMConfig", "ipamconfigurations", "IPAMConfiguration"),
    "kubecontrollersconfigurations": (
        "KubeControllersConfiguration",
        "kubecontrollersconfigurations",
        "KubeControllersConfiguration",
    ),
    "clusterinformations": ("ClusterInformation", "clusterinformations", "ClusterInformation"),
    "ippools": ("IPPool", "ippools", "IPPool"),
    "ipreservations": ("IPReservation", "ipreservations", "IPReservation"),
}
PLURALS = tuple(_RESOURCES)


@dataclass(frozen=True, slots=True)
class CalicoGroup:
    """One of the two groups; `V1` and `V3` below are the only instances."""

    name: str  # the API group
    version: str

    @property
    def api_version(self) -> str:
        return f"{self.name}/{self.version}"

    @property
    def v3(self) -> bool:
        return self.name == V3_GROUP_NAME

    def plural(self, plural: str) -> str:
        """The resource this group serves for the Calico resource ipamgc calls `plural` (its v1 name)."""
        return _RESOURCES[plural][1] if self.v3 else _known(plural)

    def kind(self, plural: str) -> str:
        """The object kind of the Calico resource `plural` (v1 name) in this group."""
        return _RESOURCES[plural][2] if self.v3 else _RESOURCES[plural][0]

    def affinity_deleted(self, deleted: bool) -> bool | str:
        """A BlockAffinity's `spec.deleted` as this group stores it (v1: a string, v3: a boolean)."""
        return deleted if self.v3 else ("true" if deleted else "false")

    def __str__(self) -> str:
        return self.api_version


V1 = CalicoGroup(V1_GROUP_NAME, "v1")
V3 = CalicoGroup(V3_GROUP_NAME, "v3")
GROUPS = (V1, V3)


def _known(plural: str) -> str:
    if plural not in _RESOURCES:
        raise KeyError(plural)
    return plural


def parse_group(text: str) -> CalicoGroup:
    """`--calico-api-group` / `IPAMGC_CALICO_API_GROUP` / `CALICO_API_GROUP`: `projectcalico.org/v3` or
    `crd.projectcalico.org/v1` (case-insensitive, as Calico compares it).  Calico reads any other value
    as v1; here it is an error, so a typo does not point the collector at the wrong group."""
    value = text.strip().lower()
    for group in GROUPS:
        if value == group.api_version:
            return group
    raise ConfigError(f"Calico API group {text!r}: expected {V3.api_version} or {V1.api_version}")


def choose(configured: CalicoGroup | None, served_groups: Iterable[str]) -> CalicoGroup:
    """Calico's `UsingV3CRDs`: the configured group, else v3 when the server has projectcalico.org and
    not crd.projectcalico.org (`served_groups`: the group names of the server's `/apis`), else v1."""
    if configured is not None:
        return configured
    served = set(served_groups)
    return V3 if V3_GROUP_NAME in served and V1_GROUP_NAME not in served else V1


def served_group_names(doc: object) -> list[str]:
    """The group names of an `/apis` APIGroupList document (malformed entries are left out)."""
    groups = doc.get("groups") if isinstance(doc, Mapping) else None
    if not isinstance(groups, list):
        raise ValueError("the /apis document has no list of groups")
    return [g["name"] for g in groups if isinstance(g, Mapping) and isinstance(g.get("name"), str)]


def group_of(obj: Mapping[str, Any]) -> CalicoGroup | None:
    """The Calico group an object's `apiVersion` names (None: neither, or no apiVersion)."""
    api_version = obj.get("apiVersion")
    for group in GROUPS:
        if isinstance(api_version, str) and api_version.lower() == group.api_version:
            return group
    return None


def plural_of_kind(kind: object) -> str | None:
    """The v1 plural of a Calico object kind of either group (`IPAMConfiguration` → `ipamconfigs`)."""
    for plural, (v1_kind, _, v3_kind) in _RESOURCES.items():
        if kind in (v1_kind, v3_kind):
            return plural
    return None


def convert(obj: Mapping[str, Any], to: CalicoGroup) -> dict[str, Any]:
    """A copy of the Calico object `obj` (either group, by its kind) as group `to` stores it: apiVersion,
    kind, and BlockAffinity `spec.deleted` re-typed (v1 `"true"` is the only true string, as Calico's
    conversion reads it).  Anything else is left as it is: a malformed field stays malformed."""
    plural = plural_of_kind(obj.get("kind"))
    if plural is None:
        raise ValueError(f"{obj.get('kind')!r} is not a Calico kind ipamgc knows")
    out = copy.deepcopy(dict(obj))
    out["apiVersion"] = to.api_version
    out["kind"] = to.kind(plural)
    spec = out.get("spec")
    if plural == "blockaffinities" and isinstance(spec, dict) and "deleted" in spec:
        deleted = spec["deleted"]
        if deleted in ("", "true", "false"):
            spec["deleted"] = to.affinity_deleted(deleted == "true")
        elif isinstance(deleted, bool):
            spec["deleted"] = to.affinity_deleted(deleted)
    return out
