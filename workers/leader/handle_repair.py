"""One IPAMHandle repair: the live re-read just before the write, and the conditional write itself.

Its own module because it is the only place the handle collector writes, and what it may write is narrow:
the IPAMHandle, never a block (so never an IP: an allocation is released only by the release path,
`workers.leader.live_release`).  The handle and every block it or the scan names are read live; the
repair goes ahead only if they still show exactly the evidence the scans observed
(`shared.handlegc.confirm`), and every write is conditional: a PUT at the resourceVersion just read, a
DELETE with the uid and resourceVersion as preconditions, a POST that fails if the handle exists.  Since
Calico's IPAM library writes the IPAMHandle *before* the block on an assignment, a CNI assigning an IP
for this handle after the re-read changes the handle's resourceVersion first, and our write gets a 409.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubeio.errors import Conflict, NotFound
from shared import blockops
from shared.consistency import Divergence, divergence_of, handle_holdings
from shared.errors import MalformedObject
from shared.handlegc import Action, Observation, action_for, confirm
from shared.model import IPAMBlock, IPAMHandle
from shared.netaddr import cidr_to_name
from shared.parse import parse_block, parse_handle
from workers.leader.audit import Result
from workers.leader.calico_objects import BLOCKS, HANDLES, ObjectApi
from workers.leader.kube import JsonObj

log = logging.getLogger("workers.handle_gc")


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one due repair: `result` (`repaired`, `refused-conflict`, `dry-run`, `error`),
    why, the action, and what the live re-read saw (the audit record's evidence)."""

    result: Result
    reason: str
    action: Action | None = None
    live: Mapping[str, Any] = field(default_factory=dict)


def read_live(api: ObjectApi, obs: Observation) -> tuple[JsonObj | None, Divergence | None, dict[str, Any]]:
    """The handle as it is now (None: absent), how it disagrees with its blocks as they are now (None:
    it agrees), and what was read.  The blocks read are those the scan found holding it, those it
    recorded when scanned and those it records now; a block that is gone holds nothing."""
    d = obs.divergence
    try:
        raw: JsonObj | None = api.get(HANDLES, d.name)
    except NotFound:
        raw = None
    handle: IPAMHandle | None = parse_handle(raw) if raw is not None else None
    cidrs = set(d.held) | set(d.recorded) | (set(handle.block) if handle is not None else set())
    blocks: list[IPAMBlock] = []
    block_rvs: dict[str, str] = {}
    for cidr in sorted(cidrs):
        try:
            block = parse_block(api.get(BLOCKS, cidr_to_name(cidr)))
        except NotFound:
            block_rvs[cidr] = "absent"
            continue
        blocks.append(block)
        block_rvs[cidr] = block.resource_version
    live = divergence_of(d.name, handle, handle_holdings(blocks).get(d.name))
    seen = {
        "handle_resource_version": handle.resource_version if handle is not None else "absent",
        "recorded": dict(handle.block) if handle is not None else {},
        "deleted": handle.deleted if handle is not None else False,
        "held": dict(live.held) if live is not None else "as recorded",
        "blocks": block_rvs,
    }
    return raw, live, seen


def repair(api: ObjectApi, obs: Observation, guard: Callable[[], None], dry_run: bool = False) -> Outcome:
    """Re-read `obs`'s handle live and, if it still shows the observed evidence, write its repair
    (nothing in a dry run).  `guard` is the fence check, called right before the write."""
    try:
        raw, live, seen = read_live(api, obs)
    except MalformedObject as exc:
        return Outcome(Result.ERROR, f"unreadable live object, never written from: {exc}")
    refusal = confirm(obs, live)
    if refusal is not None or live is None:
        return Outcome(Result.REFUSED_CONFLICT, refusal or "agrees now", live=seen)
    action = action_for(live)
    if dry_run:
        return Outcome(Result.DRY_RUN, f"would {action.value}", action, seen)
    guard()
    try:
        _write(api, action, live, raw)
    except Conflict as exc:
        return Outcome(Result.REFUSED_CONFLICT, f"written meanwhile (409): {exc}", action, seen)
    except NotFound as exc:
        return Outcome(Result.REFUSED_CONFLICT, f"deleted meanwhile (404): {exc}", action, seen)
    return Outcome(Result.REPAIRED, _done(action, live), action, seen)


def _write(api: ObjectApi, action: Action, d: Divergence, raw: JsonObj | None) -> None:
    if action is Action.CREATE:
        group = api.calico()
        body: JsonObj = {
            "apiVersion": group.api_version,
            "kind": "IPAMHandle",
            "metadata": {"name": d.name},
            "spec": {"handleID": d.handle_id, "block": dict(d.held), "deleted": False},
        }
        api.create(HANDLES, body)
        return
    assert raw is not None  # every other class is of an existing handle
    meta = raw.get("metadata") or {}
    if action is Action.DELETE:
        api.delete(HANDLES, d.name, str(meta.get("uid") or ""), str(meta.get("resourceVersion") or ""))
        return
    body = blockops.json_copy(raw)
    body["spec"]["block"] = {} if action is Action.EMPTY else dict(d.held)
    api.replace(HANDLES, body)


def _done(action: Action, d: Divergence) -> str:
    held = ", ".join(f"{c}={n}" for c, n in sorted(d.held.items()))
    if action is Action.CREATE:
        return f"missing IPAMHandle created with what the blocks hold ({held})"
    if action is Action.SET_COUNTS:
        return f"skewed counts set to what the blocks hold ({held})"
    if action is Action.EMPTY:
        return "orphan's counts emptied (no block holds it); deleted once it has held empty"
    if d.deleted:
        return "stuck soft-delete finished (deleted with uid and resourceVersion preconditions)"
    return "empty orphan deleted (uid and resourceVersion preconditions)"
