"""What `ipamgc status` shows, drawn with rich: the head (sync, grace, leader, candidates), the shards, the
workers and the handle collector's table.  Its own module so that the demo (`lab/demo.py`) draws the same
view without importing a command."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table

from ipamgc.status import Status


def _age(seconds: float | None, suffix: str = "") -> str:
    """`12.5s ago`, or `-` when there is none (no leader yet, no heartbeat)."""
    return "-" if seconds is None else f"{seconds}s{suffix}"


def render(status: Status) -> Group:
    head = Table.grid(padding=(0, 2))
    grace = "unset" if status.leak_grace_period is None else f"{status.leak_grace_period:g}s"
    resync = "never" if status.last_full_resync_age is None else f"{status.last_full_resync_age:.0f}s ago"
    head.add_row(
        f"synced: {'yes' if status.synced else 'no'}",
        f"datastore ready: {'yes' if status.datastore_ready else 'no'}",
        f"grace: {grace}",
        f"last full resync: {resync}",
        f"kubevirt: {'on' if status.kubevirt else 'off'}",
    )
    leader = status.leader
    head.add_row(
        f"leader: {leader['identity'] or '-'}",
        f"epoch: {leader['epoch']}",
        f"lease age: {_age(leader['lease_age'])}",
        f"heartbeat: {_age(leader['heartbeat_age'], ' ago')}",
    )
    head.add_row(
        f"candidates: {status.totals['candidates']}",
        f"decisions waiting: {status.decisions['pending']} (stream {status.decisions['stream']})",
        "releases: " + (", ".join(f"{k} {v}" for k, v in status.releases.items()) or "none"),
        f"IP cooldown: {'-' if status.ip_cooldown is None else f'{status.ip_cooldown}s'}",
    )
    shards = Table(title="shards", title_justify="left")
    for col in ("shard", "dirty", "in-flight", "candidates", "due", "queued jobs", "revalidating"):
        shards.add_column(col, justify="right")
    for s in status.shards:
        cells = (s.shard, s.dirty, s.inflight, s.candidates, s.due, s.queue, "yes" if s.revalidating else "")
        shards.add_row(*(str(v) for v in cells))
    workers = Table(title="workers", title_justify="left")
    for col in ("name", "state", "heartbeat", "jobs ok", "failed"):
        workers.add_column(col)
    for w in status.workers:
        beat = _age(w["heartbeat_age"], " ago")
        workers.add_row(w["name"][:12], w["state"], beat, str(w["successful_jobs"]), str(w["failed_jobs"]))
    parts: list[Table] = [head, shards, workers]
    if status.handle_gc:
        parts.append(handle_gc_table(status.handle_gc))
    return Group(*parts)


def handle_gc_table(view: dict[str, Any]) -> Table:
    """The handle collector's counts per class (docs/handles.md)."""
    age = "-" if view["scan_age"] is None else f"{view['scan_age']:.0f}s ago"
    dry = ", dry run" if view["dry_run"] else ""
    title = f"handles (last scan {age}: {view['handles']} handles, {view['blocks']} blocks{dry})"
    table = Table(title=title, title_justify="left")
    for col in ("class", "divergent", "due", "repaired", "refused"):
        table.add_column(col, justify="left" if col == "class" else "right")
    for cls, counts in view["classes"].items():
        table.add_row(cls, *(str(counts.get(k, 0)) for k in ("divergent", "due", "repaired", "refused")))
    return table
