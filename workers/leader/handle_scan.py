"""The handle collector's scan: every IPAMHandle and IPAMBlock of the cluster, listed live in pages.

Its own module because the watcher does not mirror IPAMHandles (nothing else needs them: Calico's GC
never reads them either), so the leader lists them itself, every `handle_gc_interval_seconds`, through
its own API client (`workers.leader.kube`).  Handles are listed before blocks: an assignment writes its
handle before its block and a release its block before its handle, so a CNI call in flight during a scan
can only make a handle look *ahead* of its blocks for that one scan — and the rule needs the same
disagreement over several scans and the grace period (`shared.handlegc`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from kubeio.errors import ResourceExpired
from shared.errors import MalformedObject
from shared.model import IPAMBlock, IPAMHandle
from shared.parse import parse_block, parse_handle
from workers.leader.calico_objects import BLOCKS, HANDLES, ObjectApi
from workers.leader.kube import JsonObj

log = logging.getLogger("workers.handle_gc")

RESTARTS = 3  # lists restarted after an expired continue token (410) before the scan gives up


class ScanIncomplete(Exception):
    """A block could not be read (what it holds is unknown) or a list kept expiring: no judgement."""


@dataclass
class Scan:
    """One scan: the handles by object name, the blocks, the handles that exist but could not be read
    (never judged), and how many list requests it took."""

    handles: dict[str, IPAMHandle] = field(default_factory=dict)
    blocks: list[IPAMBlock] = field(default_factory=list)
    unreadable: set[str] = field(default_factory=set)
    requests: int = 0


def list_all(api: ObjectApi, plural: str, page: int, scan: Scan) -> list[JsonObj]:
    """Every object of `plural`, page by page; a 410 on a continue token restarts the list."""
    for _ in range(RESTARTS):
        items: list[JsonObj] = []
        cont = ""
        try:
            while True:
                scan.requests += 1
                got, cont = api.list_page(plural, page, cont)
                items.extend(got)
                if not cont:
                    return items
        except ResourceExpired:
            log.info("the list of %s expired mid-way; listing again", plural)
    raise ScanIncomplete(f"the list of {plural} expired {RESTARTS} times")


def scan(api: ObjectApi, page: int) -> Scan:
    """List handles, then blocks.  A malformed handle is left out and never judged; a malformed block
    makes the scan incomplete (what it holds is unknown, so every handle's judgement would be)."""
    out = Scan()
    for raw in list_all(api, HANDLES, page, out):
        try:
            handle = parse_handle(raw)
        except MalformedObject as exc:
            name = str((raw.get("metadata") or {}).get("name") or "")
            out.unreadable.add(name)
            log.warning("unreadable IPAMHandle %s, never judged: %s", name, exc)
            continue
        out.handles[handle.name] = handle
    for raw in list_all(api, BLOCKS, page, out):
        try:
            out.blocks.append(parse_block(raw))
        except MalformedObject as exc:
            raise ScanIncomplete(f"unreadable IPAMBlock: {exc}") from exc
    return out
