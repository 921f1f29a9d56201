"""The handle collector's scan: every IPAMHandle and IPAMBlock of the cluster, listed live in pages.

Its own module because the watcher does not mirror IPAMHandles (nothing else needs them: Calico's GC
never reads them either), so the leader lists them itself, every `handle_gc_interval_seconds`, through
its own API client (`workers.leader.kube`).  Handles are listed before blocks: an assignment writes its
handle before its block and a release its block before its handle, so a CNI call in flight during a scan
can only make a handle look *ahead* of its blocks for that one scan — and the rule needs the same
disagreement over several scans and the grace period (`shared.handlegc`).

What a scan keeps is what the judgement needs: every handle, and of the blocks only what they hold per
handle, counted as each page comes (blocks come in smaller pages; no block is kept: a scan's traced peak at
50k pods was 121 MiB with every block kept parsed, 54 MiB without; docs/benchmarks.md, "The leader's handle
scan"), both in the compact tables of `shared/handletables.py` (the usual handle as one integer, its one
holding, when the blocks agree with it, as a bit of that integer).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from kubeio.errors import ResourceExpired
from shared.errors import MalformedObject
from shared.handletables import HandleTable, HoldingTable
from shared.parse import parse_block, parse_handle
from workers.leader.calico_objects import BLOCKS, HANDLES, ObjectApi
from workers.leader.kube import JsonObj

log = logging.getLogger("workers.handle_gc")

# A block is ~64 handles' worth of JSON (its attributes): blocks are listed in pages this many times
# smaller than handles, so that one page of raw blocks weighs about one page of raw handles.
BLOCK_PAGE_DIVISOR = 16
RESTARTS = 3  # lists restarted after an expired continue token (410) before the scan gives up


class ScanIncomplete(Exception):
    """A block could not be read (what it holds is unknown) or a list kept expiring: no judgement."""


@dataclass
class Scan:
    """One scan: the handles by object name, what the blocks hold per handle object name, how many blocks
    were read, the handles that exist but could not be read (never judged), and how many list requests
    it took."""

    handles: HandleTable = field(default_factory=HandleTable)
    holdings: HoldingTable = field(init=False)  # over `handles`: a usual handle's one holding is its bit
    blocks: int = 0
    unreadable: set[str] = field(default_factory=set)
    requests: int = 0

    def __post_init__(self) -> None:
        self.holdings = HoldingTable(self.handles)

    def restart(self, plural: str) -> None:
        """A list of `plural` starts again from its first page: forget what its earlier pages gave."""
        if plural == HANDLES:
            self.handles.clear()
            self.unreadable.clear()
        else:
            self.holdings.clear()
            self.blocks = 0


def list_all(api: ObjectApi, plural: str, page: int, scan: Scan, take: Callable[[JsonObj], None]) -> None:
    """Every object of `plural` handed to `take`, page by page, each page dropped once taken (one page of
    raw JSON held at a time, not the whole list); a 410 on a continue token restarts the list, after
    `Scan.restart` has forgotten what the pages before it gave."""
    for _ in range(RESTARTS):
        cont = ""
        try:
            while True:
                scan.requests += 1
                got, cont = api.list_page(plural, page, cont)
                for raw in got:
                    take(raw)
                if not cont:
                    return
        except ResourceExpired:
            log.info("the list of %s expired mid-way; listing again", plural)
            scan.restart(plural)
    raise ScanIncomplete(f"the list of {plural} expired {RESTARTS} times")


def scan(api: ObjectApi, page: int) -> Scan:
    """List handles, then blocks.  A malformed handle is left out and never judged; a malformed block
    makes the scan incomplete (what it holds is unknown, so every handle's judgement would be)."""
    out = Scan()

    def take_handle(raw: JsonObj) -> None:
        try:
            handle = parse_handle(raw)
        except MalformedObject as exc:
            name = str((raw.get("metadata") or {}).get("name") or "")
            out.unreadable.add(name)
            log.warning("unreadable IPAMHandle %s, never judged: %s", name, exc)
            return
        out.handles.add(handle)

    def take_block(raw: JsonObj) -> None:
        try:
            block = parse_block(raw)
        except MalformedObject as exc:
            raise ScanIncomplete(f"unreadable IPAMBlock: {exc}") from exc
        out.holdings.add_block(block)
        out.blocks += 1

    list_all(api, HANDLES, page, out, take_handle)
    list_all(api, BLOCKS, max(1, page // BLOCK_PAGE_DIVISOR), out, take_block)
    return out
