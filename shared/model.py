"""Typed Calico IPAM and slim Kubernetes objects.

Field names follow crd.projectcalico.org/v1 JSON (see `shared/parse.py` for the mapping and the checks).
Objects are frozen: the rules read them, nothing mutates them.  An *allocation* is Calico's GC unit: an
ordinal whose `allocations[i]` is set and whose attribute has a `handle_id`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NewType

from shared.netaddr import IPNetwork, ordinal_to_ip

HandleID = NewType("HandleID", str)
NodeName = NewType("NodeName", str)
AllocationID = NewType("AllocationID", str)

# Attribute keys inside `secondary` (Calico's ipam.Attribute* constants).
ATTR_NODE = "node"
ATTR_POD = "pod"
ATTR_NAMESPACE = "namespace"
ATTR_TYPE = "type"
ATTR_VMI_NAME = "vmi-name"

TUNNEL_TYPES = frozenset(
    {
        "ipipTunnelAddress",
        "vxlanTunnelAddress",
        "vxlanV6TunnelAddress",
        "wireguardTunnelAddress",
        "wireguardV6TunnelAddress",
    }
)
WINDOWS_RESERVED_HANDLE = "windows-reserved-ipam-handle"

# Pod annotations Calico's workload-endpoint conversion falls back to.
ANNOTATION_POD_IPS = "cni.projectcalico.org/podIPs"
ANNOTATION_POD_IP = "cni.projectcalico.org/podIP"
ANNOTATION_AWS_POD_IPS = "vpc.amazonaws.com/pod-ips"
POD_IP_ANNOTATIONS = (ANNOTATION_POD_IPS, ANNOTATION_POD_IP, ANNOTATION_AWS_POD_IPS)

# Flannel migration label (never release empty blocks of nodes being migrated).
LABEL_NODE_NETWORK_DURING_MIGRATION = "projectcalico.org/node-network-during-migration"


def sanitize_handle(handle: str) -> str:
    """Calico cuts a handle at the first carriage return (old host-local migrations left one)."""
    return handle.split("\r", 1)[0]


def allocation_id(handle: str, ip: str) -> AllocationID:
    """Calico's allocation key: `<handle>/<ip>` (the sequence number is not part of it)."""
    return AllocationID(f"{handle}/{ip}")


@dataclass(frozen=True, slots=True)
class Attribute:
    handle_id: str | None
    secondary: Mapping[str, str] = field(default_factory=dict)
    alternate_owner_attrs: Mapping[str, str] = field(default_factory=dict)
    released_at: str | None = None


class AffinityKind(StrEnum):
    HOST = "host"
    VIRTUAL = "virtual"


@dataclass(frozen=True, slots=True)
class Allocation:
    """One tracked allocation, as the GC sees it."""

    ip: str  # canonical spelling
    ordinal: int
    block: str  # block CIDR string, e.g. "10.244.1.0/26"
    handle: str
    attrs: Mapping[str, str]
    sequence_number: int

    @property
    def id(self) -> AllocationID:
        return allocation_id(self.handle, self.ip)

    @property
    def node(self) -> str:
        """The `node` attribute ("" when absent: never tracked per node, never GC'd)."""
        return self.attrs.get(ATTR_NODE, "")


@dataclass(frozen=True, slots=True)
class IPAMBlock:
    name: str
    cidr: IPNetwork
    affinity: str | None
    allocations: tuple[int | None, ...]
    unallocated: tuple[int, ...]
    attributes: tuple[Attribute, ...]
    sequence_number: int
    sequence_number_for_allocation: Mapping[int, int]
    deleted: bool = False
    affinity_claim_time: str | None = None
    resource_version: str = ""
    uid: str = ""

    @property
    def cidr_str(self) -> str:
        return str(self.cidr)

    @property
    def affinity_kind(self) -> AffinityKind | None:
        if self.affinity is None:
            return None
        return AffinityKind(self.affinity.split(":", 1)[0])

    @property
    def host(self) -> str | None:
        """The node this block is affine to (`host:` affinities only)."""
        if self.affinity is not None and self.affinity.startswith("host:"):
            return self.affinity[len("host:") :]
        return None

    @property
    def is_empty(self) -> bool:
        """GC emptiness: no non-null entry at all (reserved and cooldown ordinals count as used)."""
        return all(a is None for a in self.allocations)

    def ips_of(self, handle: str) -> list[str]:
        """The IPs this block holds for `handle` (handles compared as Calico cuts them, `sanitize_handle`), in
        ordinal order: the IPs of `iter_allocations` whose handle is it, without building the others (the
        leader's all-or-none check reads every block of a released handle)."""
        want = sanitize_handle(handle)
        mine = {
            i
            for i, a in enumerate(self.attributes)
            if a.handle_id is not None and sanitize_handle(a.handle_id) == want
        }
        if not mine:
            return []
        return [str(ordinal_to_ip(self.cidr, o)) for o, i in enumerate(self.allocations) if i in mine]

    def iter_allocations(self) -> Iterator[Allocation]:
        """Every ordinal in use whose attribute carries a handle (Calico's GC units)."""
        for ordinal, index in enumerate(self.allocations):
            if index is None:
                continue
            attr = self.attributes[index]
            if attr.handle_id is None:
                continue
            yield Allocation(
                ip=str(ordinal_to_ip(self.cidr, ordinal)),
                ordinal=ordinal,
                block=self.cidr_str,
                handle=attr.handle_id,
                attrs=attr.secondary,
                sequence_number=self.sequence_number_for_allocation.get(ordinal, 0),
            )


@dataclass(frozen=True, slots=True)
class IPAMHandle:
    name: str
    handle_id: str
    block: Mapping[str, int]
    deleted: bool = False
    resource_version: str = ""


@dataclass(frozen=True, slots=True)
class BlockAffinity:
    name: str
    state: str
    node: str
    type: AffinityKind
    cidr: IPNetwork
    deleted: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)
    resource_version: str = ""


class PodPhase(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    UNKNOWN = "Unknown"


FINISHED_PHASES = frozenset({"Succeeded", "Failed", "Completed"})


@dataclass(frozen=True, slots=True)
class Pod:
    """The slim pod: only what the rules read (Calico's v3.31 transformer, plus status.reason)."""

    namespace: str
    name: str
    uid: str = ""
    node_name: str = ""
    host_network: bool = False
    phase: str = ""
    reason: str = ""
    pod_ip: str = ""
    pod_ips: tuple[str, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    deletion_timestamp: bool = False
    resource_version: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    uid: str = ""
    resource_version: str = ""
