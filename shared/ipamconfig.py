"""Calico's IPAM configuration singleton, as far as the collector reads it: the IP cooldown.

Why a module: the leader reads `IPAMConfig/default` (crd.projectcalico.org/v1; `IPAMConfiguration` in
projectcalico.org/v3, same spec) before it writes a release or returns cold IPs, as the library's
`ReleaseIPs` and kube-controllers' `garbageCollectColdIPs` do (spec §1.5, §3.12).  A missing object is
Calico's defaults (no cooldown).  A value the CRD's schema would refuse (not an integer in 0..1200) is
read as the longest cooldown the schema allows: a release is never refused for it, and the IP is kept
off reuse for longer rather than shorter.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

CONFIG_NAME = "default"
# The CRD's bounds on `spec.ipCooldownSeconds`.
MAX_COOLDOWN_SECONDS = 1200


@dataclass(frozen=True, slots=True)
class IPAMConfig:
    ip_cooldown_seconds: int = 0  # 0: released IPs go straight back to `unallocated`
    problem: str | None = None  # why the object was not read as written (None: it was)


DEFAULT = IPAMConfig()


def parse_ipam_config(raw: object) -> IPAMConfig:
    """The cooldown of an IPAMConfig object (None/absent spec field: 0)."""
    spec = raw.get("spec") if isinstance(raw, Mapping) else None
    if spec is None:
        return DEFAULT
    if not isinstance(spec, Mapping):
        return IPAMConfig(MAX_COOLDOWN_SECONDS, "spec is not an object")
    value = spec.get("ipCooldownSeconds")
    if value is None:
        return DEFAULT
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COOLDOWN_SECONDS:
        why = f"ipCooldownSeconds {value!r} is not an integer in 0..{MAX_COOLDOWN_SECONDS}"
        return IPAMConfig(MAX_COOLDOWN_SECONDS, why)
    return IPAMConfig(value)
