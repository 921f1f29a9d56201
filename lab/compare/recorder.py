"""What a collector did to a sandboxed cluster, read from the store's commits: what went, and when.

Why a module of its own: both collectors are judged by the same observer, one that sees every write
whoever made it (a store commit hook runs for HTTP and in-process writes alike) and knows nothing of
either collector.  An allocation is *released* when its ordinal stops holding that handle (freed, or
parked in IP cooldown), a cooling ordinal when it goes back to `unallocated`; a block or an affinity
when its object is deleted (an affinity marked `pendingDeletion` counts once it is gone).  Times are
seconds since the collector was started; `ready` is when it said it had synced.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from lab.compare.facts import AllocKey
from shared.netaddr import ordinal_to_ip, parse_network

__all__ = ["IPAM_PLURALS", "Outcome", "Recorder"]

IPAM_PLURALS = frozenset({"ipamblocks", "blockaffinities", "ipamhandles"})


@dataclass
class Outcome:
    """One collector's run: when each allocation, block and affinity went (absent: kept)."""

    collector: str
    released: dict[AllocKey, float] = field(default_factory=dict)
    blocks_deleted: dict[str, float] = field(default_factory=dict)
    affinities_deleted: dict[str, float] = field(default_factory=dict)
    writes: int = 0  # writes to IPAM objects
    ready: float | None = None  # seconds after start it had synced
    ended: float = 0.0  # seconds after start the run was stopped
    quiet: bool = False  # stopped because quiet (else: the deadline, or an error)
    error: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "collector": self.collector,
            "ready_seconds": None if self.ready is None else round(self.ready, 2),
            "ended_seconds": round(self.ended, 2),
            "quiet": self.quiet,
            "ipam_writes": self.writes,
            "released": len(self.released),
            "blocks_deleted": len(self.blocks_deleted),
            "affinities_deleted": len(self.affinities_deleted),
            "error": self.error,
        }


def _held(spec: dict[str, Any]) -> dict[int, str]:
    """ordinal → handle ("" for a cooling ordinal) of every allocated ordinal of a block spec."""
    attributes = spec.get("attributes") or []
    out: dict[int, str] = {}
    for ordinal, index in enumerate(spec.get("allocations") or []):
        if isinstance(index, int) and 0 <= index < len(attributes) and isinstance(attributes[index], dict):
            out[ordinal] = str(attributes[index].get("handle_id") or "")
    return out


class Recorder:
    """A store commit hook (`store.add_hook(recorder)`) filling an `Outcome`."""

    def __init__(self, collector: str) -> None:
        self.outcome = Outcome(collector)
        self.start = time.monotonic()
        self.last_write = self.start
        self._lock = threading.Lock()

    def restart(self) -> None:
        """Start the clock (when the collector is started); earlier writes (the load) are not its."""
        with self._lock:
            self.start = self.last_write = time.monotonic()
            self.outcome = Outcome(self.outcome.collector)

    def now(self) -> float:
        return time.monotonic() - self.start

    def quiet_for(self) -> float:
        with self._lock:
            return time.monotonic() - self.last_write

    def __call__(
        self, plural: str, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None
    ) -> None:
        if plural not in IPAM_PLURALS:
            return
        with self._lock:
            at = time.monotonic()
            self.last_write = at
            out = self.outcome
            out.writes += 1
            rel = at - self.start
            obj = new if new is not None else old
            if obj is None:
                return
            if plural == "blockaffinities" and etype == "DELETED":
                out.affinities_deleted.setdefault(str(obj["metadata"]["name"]), rel)
            elif plural == "ipamblocks" and old is not None:
                self._block(old, new if etype != "DELETED" else None, rel)

    def _block(self, old: dict[str, Any], new: dict[str, Any] | None, rel: float) -> None:
        spec = old.get("spec") or {}
        cidr = str(spec.get("cidr"))
        try:
            net = parse_network(cidr)
        except ValueError:
            return
        before = _held(spec)
        after = _held(new.get("spec") or {}) if new is not None else {}
        if new is None:
            self.outcome.blocks_deleted.setdefault(cidr, rel)
        for ordinal, handle in before.items():
            if after.get(ordinal) != handle:
                key = (cidr, ordinal, handle, str(ordinal_to_ip(net, ordinal)))
                self.outcome.released.setdefault(key, rel)
