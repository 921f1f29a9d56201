"""One error tree for the whole system.

Transient errors are retried with back-off; permanent ones are logged, counted and skipped.  Malformed
Kubernetes or Calico objects are permanent errors that carry the object's identity, so a skip can always be
reported as "kind/name: reason".  Adapters translate library exceptions into this tree at their edge.
"""

from __future__ import annotations


class IpamgcError(Exception):
    """Base of every error ipamgc raises on purpose."""


class TransientError(IpamgcError):
    """Worth retrying with back-off (API 5xx/429, Redis connection loss, a 409 conflict)."""


class PermanentError(IpamgcError):
    """Retrying as-is cannot help: log, count, skip."""


class ConfigError(PermanentError):
    """A flag, environment variable or configuration object is invalid."""


class SnapshotError(PermanentError):
    """A snapshot file is unreadable or is not a Kubernetes List."""


class MalformedObject(PermanentError):
    """A Kubernetes/Calico object that cannot be trusted.  Never decide a release from it."""

    code = "malformed"

    def __init__(self, kind: str, name: str, detail: str) -> None:
        self.kind = kind
        self.name = name
        self.detail = detail
        super().__init__(f"{kind}/{name or '<unnamed>'}: {self.code}: {detail}")


class MissingMetadata(MalformedObject):
    code = "missing-metadata"


class MissingSpec(MalformedObject):
    code = "missing-spec"


class WrongFieldType(MalformedObject):
    code = "wrong-field-type"


class BadCIDR(MalformedObject):
    code = "bad-cidr"


class NonCanonicalCIDR(MalformedObject):
    code = "non-canonical-cidr"


class AllocationsLengthMismatch(MalformedObject):
    code = "allocations-length-mismatch"


class AttributeIndexOutOfRange(MalformedObject):
    code = "attribute-index-out-of-range"


class OrdinalOutOfRange(MalformedObject):
    code = "ordinal-out-of-range"


class OrdinalAllocatedAndFree(MalformedObject):
    code = "ordinal-allocated-and-free"


class DuplicateFreeOrdinal(MalformedObject):
    code = "duplicate-free-ordinal"


class NonStringHandle(MalformedObject):
    code = "non-string-handle"


class BadAttributes(MalformedObject):
    code = "bad-attributes"


class BadSequenceNumber(MalformedObject):
    code = "bad-sequence-number"


class UnknownAffinityPrefix(MalformedObject):
    code = "unknown-affinity-prefix"


class BadAffinity(MalformedObject):
    code = "bad-affinity"


class BadPodIP(MalformedObject):
    """A reported pod IP that does not parse.  `pod`: the slim pod with its IPs as written, when the rest
    of it read well: Calico decides a pod on another node (and, read live, an evicted one) before it
    parses any IP; a finished pod only after (`shared.podips`)."""

    code = "bad-pod-ip"

    def __init__(self, kind: str, name: str, detail: str, pod: object | None = None) -> None:
        super().__init__(kind, name, detail)
        self.pod = pod


class BadHandle(MalformedObject):
    code = "bad-handle"
