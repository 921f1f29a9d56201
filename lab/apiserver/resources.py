"""What the simulated API server serves, and how it says no.

:class:`ResourceType` describes one served resource (group, version, plural, scope and the
few per-resource quirks the server honours); :data:`RESOURCES` is the served set and
:class:`Registry` looks them up. :class:`SimApiError` is every API error the store and the
HTTP layer raise, rendered as the ``Status`` object a real API server sends. Both sit at
the bottom of the simulator's import graph: storage, patching, watches and HTTP all use them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from shared.calicogroup import PLURALS, V1, CalicoGroup

__all__ = [
    "CALICO_GROUP",
    "CALICO_OTHER",
    "CRD_RESOURCE",
    "RESOURCES",
    "JsonObj",
    "Key",
    "Registry",
    "ResourceType",
    "SimApiError",
    "calico_resources",
    "crd_object",
    "deep_copy",
    "resources_for",
]

JsonObj = dict[str, Any]
Key = tuple[str, str]  # (namespace, name); namespace is "" for cluster-scoped resources

CALICO_GROUP = V1.name  # the group of the default `RESOURCES`
_POD_FIELDS = (
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
)


@dataclass(frozen=True, slots=True)
class ResourceType:
    """One served resource, as its API group serves it.

    ``create_on_update``: PUT may create (leases); ``unconditional_update``: PUT without a
    ``metadata.resourceVersion`` overwrites (False: 422, as for leases); ``returns_deleted``:
    DELETE answers with the deleted object rather than a success ``Status``; ``custom``:
    CRD-backed (no strategic merge patch); ``field_labels``: extra fields selectable by
    fieldSelector.
    """

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()
    field_labels: tuple[str, ...] = ()
    create_on_update: bool = False
    unconditional_update: bool = True
    returns_deleted: bool = True
    custom: bool = False
    dns_label_names: bool = False
    # Names in-process callers may use for it beside `plural` (never served over HTTP): Calico's
    # resources keep their crd.projectcalico.org/v1 names inside ipamgc whatever group serves them.
    aliases: tuple[str, ...] = ()
    # (dotted path, JSON type) the CRD's schema types: a write with another type is 422, as the API
    # server's validation refuses it (BlockAffinity `spec.deleted`: a string in v1, a boolean in v3).
    typed_fields: tuple[tuple[str, type], ...] = ()
    selectable: frozenset[str] = field(init=False, default=frozenset())

    def __post_init__(self) -> None:
        fields = {"metadata.name", "metadata.namespace", *self.field_labels}
        object.__setattr__(self, "selectable", frozenset(fields))

    @property
    def api_version(self) -> str:
        """``v1`` for the core group, ``group/version`` otherwise."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        """The kind of a LIST response."""
        return self.kind + "List"

    @property
    def qualified(self) -> str:
        """``plural.group`` as it appears in API error messages."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


# Calico's CRDs with a `status` subresource (its CRDs' `subresources: {status: {}}`; Calico's
# kube-controllers PUTs its KubeControllersConfiguration's status before any controller starts).
_CALICO_STATUS = frozenset({"kubecontrollersconfigurations", "ippools", "tiers", "caliconodestatuses"})

#: Calico's resources beyond the ones ipamgc reads, which a Calico cluster serves all the same (both groups
#: name them alike): plural → (kind, namespaced).  Calico's kube-controllers creates the `default`,
#: `kube-admin` and `kube-baseline` Tiers at start (a 404 there is fatal) and its data feed lists host
#: endpoints and policies.  Scopes, kinds and subresources are those of Calico's own CRDs
#: (release-v3.33; tests/lab/apiserver/test_kube_controllers_needs.py holds them against
#: `../shared/calico-crds`).
CALICO_OTHER: dict[str, tuple[str, bool]] = {
    "bgpconfigurations": ("BGPConfiguration", False),
    "bgpfilters": ("BGPFilter", False),
    "bgppeers": ("BGPPeer", False),
    "caliconodestatuses": ("CalicoNodeStatus", False),
    "felixconfigurations": ("FelixConfiguration", False),
    "globalnetworkpolicies": ("GlobalNetworkPolicy", False),
    "globalnetworksets": ("GlobalNetworkSet", False),
    "hostendpoints": ("HostEndpoint", False),
    "networkpolicies": ("NetworkPolicy", True),
    "networksets": ("NetworkSet", True),
    "stagedglobalnetworkpolicies": ("StagedGlobalNetworkPolicy", False),
    "stagedkubernetesnetworkpolicies": ("StagedKubernetesNetworkPolicy", True),
    "stagednetworkpolicies": ("StagedNetworkPolicy", True),
    "tiers": ("Tier", False),
}


def _calico(group: CalicoGroup, plural: str) -> ResourceType:
    # Custom resources, like leases, refuse an update without metadata.resourceVersion (422 Invalid).
    served = group.plural(plural)
    typed: tuple[tuple[str, type], ...] = ()
    if plural == "blockaffinities":
        typed = (("spec.deleted", bool if group.v3 else str),)
    return ResourceType(
        group.name,
        group.version,
        served,
        group.kind(plural),
        namespaced=False,
        subresources=("status",) if plural in _CALICO_STATUS else (),
        custom=True,
        unconditional_update=False,
        aliases=(plural,) if served != plural else (),
        typed_fields=typed,
    )


def _calico_other(group: CalicoGroup, plural: str) -> ResourceType:
    kind, namespaced = CALICO_OTHER[plural]
    return ResourceType(
        group.name,
        group.version,
        plural,
        kind,
        namespaced=namespaced,
        subresources=("status",) if plural in _CALICO_STATUS else (),
        custom=True,
        unconditional_update=False,
    )


def calico_resources(group: CalicoGroup) -> tuple[ResourceType, ...]:
    """Calico's resources as `group` serves them (a cluster serves one group: `resources_for`)."""
    return tuple(_calico(group, plural) for plural in PLURALS) + tuple(
        _calico_other(group, plural) for plural in CALICO_OTHER
    )


#: Kubernetes' own served resources.
CORE_RESOURCES: tuple[ResourceType, ...] = (
    ResourceType("", "v1", "namespaces", "Namespace", False, ("ns",), ("status",), dns_label_names=True),
    ResourceType(
        "", "v1", "nodes", "Node", False, ("no",), ("status",), ("spec.unschedulable",), returns_deleted=False
    ),
    ResourceType("", "v1", "pods", "Pod", True, ("po",), ("status",), _POD_FIELDS),
    ResourceType("", "v1", "serviceaccounts", "ServiceAccount", True, ("sa",)),
    ResourceType(
        "coordination.k8s.io",
        "v1",
        "leases",
        "Lease",
        True,
        create_on_update=True,
        unconditional_update=False,
        returns_deleted=False,
    ),
)


#: apiextensions.k8s.io/v1 CustomResourceDefinitions: Calico's kube-controllers lists and watches them (the
#: store holds one for each served custom resource: `crd_object`).
CRD_RESOURCE = ResourceType(
    "apiextensions.k8s.io",
    "v1",
    "customresourcedefinitions",
    "CustomResourceDefinition",
    False,
    ("crd", "crds"),
    ("status",),
    unconditional_update=False,
)


def resources_for(group: CalicoGroup) -> tuple[ResourceType, ...]:
    """What a cluster whose Calico objects live in `group` serves (KubeVirt's are added by callers)."""
    return (*CORE_RESOURCES, CRD_RESOURCE, *calico_resources(group))


def crd_object(rt: ResourceType) -> JsonObj:
    """The CustomResourceDefinition a real cluster holds for the custom resource `rt` (what a client
    reads of it: names, scope, the served version and its subresources)."""
    version: JsonObj = {"name": rt.version, "served": True, "storage": True}
    if rt.subresources:
        version["subresources"] = {sub: {} for sub in rt.subresources}
    names: JsonObj = {
        "plural": rt.plural,
        "singular": rt.kind.lower(),
        "kind": rt.kind,
        "listKind": rt.list_kind,
    }
    if rt.short_names:
        names["shortNames"] = list(rt.short_names)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{rt.plural}.{rt.group}"},
        "spec": {
            "group": rt.group,
            "names": names,
            "scope": "Namespaced" if rt.namespaced else "Cluster",
            "versions": [version],
        },
        "status": {"conditions": [{"type": "Established", "status": "True"}], "acceptedNames": names},
    }


#: The served resources of a cluster with crd.projectcalico.org/v1 (every Calico before 3.33's v3 CRDs).
RESOURCES: tuple[ResourceType, ...] = resources_for(V1)


KUBEVIRT_GROUP = "kubevirt.io"

#: KubeVirt's objects, served only by a cluster that has KubeVirt (`Store(RESOURCES + KUBEVIRT_RESOURCES)`).
KUBEVIRT_RESOURCES: tuple[ResourceType, ...] = (
    ResourceType(KUBEVIRT_GROUP, "v1", "virtualmachines", "VirtualMachine", True, ("vm", "vms"), custom=True),
    ResourceType(
        KUBEVIRT_GROUP,
        "v1",
        "virtualmachineinstances",
        "VirtualMachineInstance",
        True,
        ("vmi", "vmis"),
        custom=True,
    ),
)


class SimApiError(Exception):
    """An API error, rendered over HTTP as a ``Status`` object with the same code/reason."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        *,
        details: JsonObj | None = None,
        retry_after: float | None = None,
        metadata: JsonObj | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details or {}
        self.retry_after = retry_after
        self.metadata = metadata or {}

    def status(self) -> JsonObj:
        """The ``Status`` object a real API server sends for this error."""
        out: JsonObj = {"kind": "Status", "apiVersion": "v1", "metadata": self.metadata}
        out.update(status="Failure", message=self.message, reason=self.reason)
        if self.details:
            out["details"] = self.details
        out["code"] = self.code
        return out

    @classmethod
    def _for(cls, code: int, reason: str, msg: str, rt: ResourceType, name: str) -> SimApiError:
        details: JsonObj = {"name": name, "kind": rt.plural}
        if rt.group:
            details["group"] = rt.group
        return cls(code, reason, msg, details=details)

    @classmethod
    def not_found(cls, rt: ResourceType, name: str) -> SimApiError:
        """404 NotFound for a named object."""
        return cls._for(404, "NotFound", f'{rt.qualified} "{name}" not found', rt, name)

    @classmethod
    def already_exists(cls, rt: ResourceType, name: str) -> SimApiError:
        """409 AlreadyExists."""
        return cls._for(409, "AlreadyExists", f'{rt.qualified} "{name}" already exists', rt, name)

    @classmethod
    def conflict(cls, rt: ResourceType, name: str, why: str) -> SimApiError:
        """409 Conflict (optimistic concurrency or precondition failure)."""
        msg = f'Operation cannot be fulfilled on {rt.qualified} "{name}": {why}'
        return cls._for(409, "Conflict", msg, rt, name)

    @classmethod
    def invalid(cls, rt: ResourceType, name: str, fld: str, why: str) -> SimApiError:
        """422 Invalid with one field cause."""
        details: JsonObj = {"name": name, "kind": rt.kind}
        if rt.group:
            details["group"] = rt.group
        details["causes"] = [{"reason": "FieldValueInvalid", "message": why, "field": fld}]
        return cls(422, "Invalid", f'{rt.kind} "{name}" is invalid: {fld}: {why}', details=details)

    @classmethod
    def bad_request(cls, message: str) -> SimApiError:
        """400 BadRequest."""
        return cls(400, "BadRequest", message)

    @classmethod
    def expired(cls, message: str, metadata: JsonObj | None = None) -> SimApiError:
        """410 Expired (a compacted resourceVersion or continue token)."""
        return cls(410, "Expired", message, metadata=metadata)


class Registry:
    """Lookup of :class:`ResourceType` by plural or by (group, version, plural)."""

    def __init__(self, resources: Iterable[ResourceType]) -> None:
        self._all = tuple(resources)
        self._by_plural = {rt.plural: rt for rt in self._all}
        self._by_gvr = {(rt.group, rt.version, rt.plural): rt for rt in self._all}
        if len(self._by_plural) != len(self._all):
            raise ValueError("resource plurals must be unique")
        for rt in self._all:
            for alias in rt.aliases:
                if alias in self._by_plural:
                    raise ValueError(f"alias {alias!r} of {rt.plural} is taken")
                self._by_plural[alias] = rt

    def __iter__(self) -> Iterator[ResourceType]:
        return iter(self._all)

    def get(self, plural: str | ResourceType) -> ResourceType:
        """The resource for ``plural``; 404 (the server's unknown-resource error) if none."""
        if isinstance(plural, ResourceType):
            return plural
        try:
            return self._by_plural[plural]
        except KeyError:
            raise SimApiError(404, "NotFound", "the server could not find the requested resource") from None

    def lookup(self, group: str, version: str, plural: str) -> ResourceType | None:
        """The resource served at ``group/version/plural``, if any."""
        return self._by_gvr.get((group, version, plural))

    def group_versions(self) -> list[tuple[str, str]]:
        """Served (group, version) pairs in registration order ("" is the core group)."""
        return list(dict.fromkeys((rt.group, rt.version) for rt in self._all))

    def calico_group(self) -> CalicoGroup | None:
        """The Calico group served (the group of `ipamblocks`), None when Calico is not served."""
        rt = self._by_plural.get("ipamblocks")
        if rt is None:
            return None
        return CalicoGroup(rt.group, rt.version)

    def in_group_version(self, group: str, version: str) -> list[ResourceType]:
        """Resources served in one group/version."""
        return [rt for rt in self._all if rt.group == group and rt.version == version]


def deep_copy(obj: Any) -> Any:
    """A deep copy of a JSON value (via orjson); 400 BadRequest if it is not JSON."""
    try:
        return orjson.loads(orjson.dumps(obj))
    except TypeError as exc:
        raise SimApiError.bad_request(f"object is not JSON-serialisable: {exc}") from None
