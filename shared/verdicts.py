"""The vocabulary of the validity rules: what they are told (`Lookup`, `PodView`, `KubeVirtView`) and what
they answer (`AllocationType`, `Validity`, `Verdict`, `LeakState`, `Release`, `Reason`).

Why a module of its own: these words are shared by both steps of the rules (one allocation,
`shared.allocrules`; a node, a handle, a block, `shared.rules`) and by their readers (the workers,
`shared.audit`, `ipamgc check`), so they sit below all of them and neither rule module imports the other
just for a type.  Pure data: no I/O, no rule.  `shared.rules` re-exports the names the workers import.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum, StrEnum

from shared.model import Allocation, Pod


class AllocationType(StrEnum):
    POD = "pod"
    TUNNEL = "tunnel"
    VM = "vm"
    RESERVED = "reserved"
    UNKNOWN = "unknown"


class LeakState(StrEnum):
    VALID = "valid"  # in use, or cannot be judged
    IGNORED = "ignored"  # invalid, but not a candidate (no grace period set, or waiting on the node)
    CANDIDATE = "candidate"  # invalid on a live node, inside its grace period
    CONFIRMED = "confirmed"  # a leak: releasable once its handle is all-or-none confirmed


class Release(StrEnum):
    NOW = "now"
    AFTER_GRACE = "after-grace"
    NEVER = "never"


class Reason(StrEnum):
    """Short codes explaining a verdict; documented for operators in the README."""

    # valid
    POD_RUNNING = "pod-running"
    STALE_NODE_ATTRIBUTE = "stale-node-attribute"
    NO_POD_IP_YET = "no-pod-ip-yet"
    NO_OWNER_ATTRIBUTES = "no-owner-attributes"
    NO_NODE_ATTRIBUTE = "no-node-attribute"
    POD_UNKNOWN = "pod-unknown"
    POD_IP_UNPARSABLE = "pod-ip-unparsable"
    TUNNEL_NODE_EXISTS = "tunnel-node-exists"
    WINDOWS_RESERVED = "windows-reserved"
    UNKNOWN_SOURCE = "unknown-source"
    KUBEVIRT_ABSENT = "kubevirt-absent"
    VM_EXISTS = "vm-exists"
    VMI_STANDALONE = "vmi-standalone"
    VM_UNKNOWN = "vm-unknown"
    # invalid
    POD_MISSING = "pod-missing"
    POD_ON_OTHER_NODE = "pod-on-other-node"
    POD_IP_MISMATCH = "pod-ip-mismatch"
    POD_TERMINATED = "pod-terminated"
    POD_EVICTED = "pod-evicted"
    VM_MISSING = "vm-missing"
    NODE_MISSING = "node-missing"
    NODE_IN_USE = "node-in-use"
    # empty blocks
    EMPTY_BLOCK = "empty-block"
    LAST_BLOCK = "last-block"
    NODE_MIGRATING = "node-migrating"
    BLOCK_GC_DISABLED = "block-gc-disabled"
    UNAFFINE_BLOCK = "unaffine-block"


class Lookup(Enum):
    """Outcome of looking an owner up, when it is not the object itself."""

    MISSING = "missing"  # authoritatively not found (NotFound from a synced cache or the API)
    UNKNOWN = "unknown"  # lookup failed or the object was unparsable: assume it exists


PodView = Pod | Lookup


@dataclass(frozen=True, slots=True)
class KubeVirtView:
    """What the VM rule needs.  Pass `None` instead when KubeVirt is not installed."""

    vms: frozenset[tuple[str, str]]
    # VMI (namespace, name) → whether an ownerReference of kind VirtualMachine points at it.
    vmis_owned_by_vm: Mapping[tuple[str, str], bool]
    # VMs whose mirrored record could not be read: a lookup error, which Calico counts valid.
    unknown: frozenset[tuple[str, str]] = frozenset()


@dataclass(frozen=True, slots=True)
class Validity:
    valid: bool
    reason: Reason


@dataclass(frozen=True, slots=True)
class Verdict:
    """The decision for one allocation at `now`."""

    allocation: Allocation
    type: AllocationType
    valid: bool
    reason: Reason
    state: LeakState
    first_seen: float | None  # when it was first seen invalid (candidate timer), None when valid
