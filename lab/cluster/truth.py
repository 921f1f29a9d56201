"""Ground truth of the simulated cluster: which IPs are in use and which are leaked, at every moment.

Every allocation the simulator makes is recorded with when it was allocated, when it stopped being used
(a pod deleted without CNI DEL, a dead node, an IP changed under a pod) and when it was freed.  Every free
that the simulator did not do itself (i.e. a release by ipamgc, observed on the IPAMBlock writes) is judged:
freeing an IP that was still in use is a *violation* — a duplicate IP in production.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.blockops import ip_of


@dataclass
class Usage:
    ip: str
    handle: str
    owner: str  # "ns/pod", "tunnel:node", "reserved:node"
    allocated_at: float
    in_use_until: float | None = None  # None while in use
    freed_at: float | None = None  # None while allocated
    freed_by: str = ""  # "cni" or "external"

    @property
    def leaked(self) -> bool:
        return self.in_use_until is not None and self.freed_at is None


@dataclass(frozen=True)
class Violation:
    ip: str
    owner: str
    released_at: float
    detail: str


@dataclass
class GroundTruth:
    usages: dict[str, list[Usage]] = field(default_factory=dict)  # ip → lifetimes, newest last
    violations: list[Violation] = field(default_factory=list)
    unexpected: list[tuple[str, float]] = field(default_factory=list)  # external frees of unknown IPs
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _cni_freeing: set[str] = field(default_factory=set)

    def allocated(self, ip: str, handle: str, owner: str, at: float) -> Usage:
        u = Usage(ip, handle, owner, at)
        with self._lock:
            self.usages.setdefault(ip, []).append(u)
        return u

    def current(self, ip: str) -> Usage | None:
        with self._lock:
            lives = self.usages.get(ip)
            return lives[-1] if lives and lives[-1].freed_at is None else None

    def stop_using(self, ip: str, at: float) -> None:
        """The IP is still allocated but nothing uses it any more: a leak from `at`."""
        with self._lock:
            lives = self.usages.get(ip)
            if lives and lives[-1].freed_at is None and lives[-1].in_use_until is None:
                lives[-1].in_use_until = at

    def cni_freeing(self, ips: list[str], on: bool) -> None:
        with self._lock:
            if on:
                self._cni_freeing.update(ips)
            else:
                self._cni_freeing.difference_update(ips)

    def observe_free(self, ip: str, at: float) -> None:
        """Called for every ordinal freed on an IPAMBlock write (by whoever wrote it)."""
        with self._lock:
            lives = self.usages.get(ip)
            life = lives[-1] if lives and lives[-1].freed_at is None else None
            if ip in self._cni_freeing:
                if life is not None:
                    if life.in_use_until is None:
                        life.in_use_until = at
                    life.freed_at, life.freed_by = at, "cni"
                return
            if life is None:
                self.unexpected.append((ip, at))
                return
            if life.in_use_until is None or at < life.in_use_until:
                self.violations.append(Violation(ip, life.owner, at, "released while in use"))
            life.freed_at, life.freed_by = at, "external"

    def observe_block_write(
        self, event: str, old: Mapping[str, Any], new: Mapping[str, Any] | None, at: float
    ) -> None:
        """Judge every ordinal an IPAMBlock write (`event`, from `old` to `new`) freed or parked in
        cooldown, as `observe_free`."""
        spec = old.get("spec", {})
        before = spec.get("allocations") or []
        before_attrs = spec.get("attributes") or []
        new_spec = (new or {}).get("spec", {}) if event != "DELETED" else {}
        after = new_spec.get("allocations") if event != "DELETED" else None
        after_attrs = new_spec.get("attributes") or []
        for ordinal, idx in enumerate(before):
            if idx is None or not _held(before_attrs, idx):
                continue  # free, or already parked in IP cooldown (its return is no release)
            if after is None or ordinal >= len(after) or not _held(after_attrs, after[ordinal]):
                self.observe_free(ip_of(spec, ordinal), at)  # freed, or parked in cooldown

    # -- questions tests and the benchmark ask -------------------------------------------------------

    def leaked_ips(self) -> set[str]:
        with self._lock:
            return {ip for ip, lives in self.usages.items() if lives[-1].leaked}

    def in_use_ips(self) -> set[str]:
        with self._lock:
            return {
                ip
                for ip, lives in self.usages.items()
                if lives[-1].freed_at is None and lives[-1].in_use_until is None
            }

    def released_leaks(self) -> list[Usage]:
        """Leaks that an external writer (ipamgc) released, with their timing."""
        with self._lock:
            return [u for lives in self.usages.values() for u in lives if u.freed_by == "external"]

    def release_latencies(self) -> list[float]:
        return [u.freed_at - u.in_use_until for u in self.released_leaks() if u.freed_at and u.in_use_until]


def _held(attrs: list[Any], index: object) -> bool:
    """The ordinal points to an attribute with a handle (allocated, not free nor cooling down)."""
    if not isinstance(index, int) or not 0 <= index < len(attrs) or not isinstance(attrs[index], Mapping):
        return False
    return attrs[index].get("handle_id") is not None
