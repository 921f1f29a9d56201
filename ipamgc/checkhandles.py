"""What `ipamgc check` says about IPAMHandles: each one that disagrees with its blocks, its class, what the
leader's handle collector would write, and when at the earliest (docs/handles.md).

Why a module of its own: `ipamgc/check.py` judges allocations; the handle half is another judgement
(`shared.consistency.handle_divergences`, the collector's own) with its own timing, which depends on the
leader's settings (its grace floor, its scan interval, the three scans) rather than the workers' rules.
A snapshot holds no history, so "when" is counted from the moment a leader first sees the disagreement:
a running leader may have seen it already (`ipamgc status`, its handles table).
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.table import Table

from shared.consistency import Divergence, handle_divergences
from shared.duration import format_duration
from shared.handlegc import action_for, earliest_repair
from shared.snapshot import Inventory
from workers.leader.settings import LeaderSettings


def repair_delay(grace: float | None, settings: LeaderSettings | None = None) -> float:
    """Seconds from a leader's first sight of a divergence to its earliest repair, with `grace` (the leak
    grace period; None: unset, Calico's default then) and the leader's default settings."""
    s = settings or LeaderSettings()
    hgrace = max(
        grace if grace is not None else s.base.default_leak_grace_seconds, s.handle_gc_min_grace_seconds
    )
    return earliest_repair(hgrace, s.handle_gc_interval_seconds, s.handle_gc_passes)


def divergent_handles(inv: Inventory) -> list[Divergence]:
    return handle_divergences(inv.blocks.values(), inv.handles)


def _counts(counts: Any) -> str:
    return ", ".join(f"{c}={n}" for c, n in sorted(counts.items())) or "-"


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def handles_json(divergences: list[Divergence], grace: float | None, now: float) -> dict[str, Any]:
    delay = repair_delay(grace)
    return {
        "repair_after_seconds": delay,
        "handles": [
            {
                "handle": d.handle_id,
                "name": d.name,
                "class": d.cls.value,
                "recorded": dict(d.recorded),
                "held": dict(d.held),
                "deleted": d.deleted,
                "action": "refused: handle id spelled in two cases" if d.ambiguous else action_for(d).value,
                "earliest_repair": _stamp(now + delay),
            }
            for d in divergences
        ],
    }


def render_handles(divergences: list[Divergence], grace: float | None, now: float, console: Console) -> None:
    """A table of the divergent handles, then one line on when the leader repairs them."""
    if not divergences:
        return
    delay = repair_delay(grace)
    table = Table(
        title=f"IPAMHandles out of step with their blocks: {len(divergences)}", title_justify="left"
    )
    for col in ("handle", "class", "handle records", "blocks hold", "repair"):
        table.add_column(col, overflow="fold")
    for d in divergences:
        action = "never (ambiguous id)" if d.ambiguous else action_for(d).value
        recorded = _counts(d.recorded) + (" (soft-deleted)" if d.deleted else "")
        table.add_row(d.handle_id, d.cls.value, recorded, _counts(d.held), action)
    console.print(table)
    console.print(
        f"the leader repairs each once it has seen it unchanged for {format_duration(delay)} and in 3 "
        f"scans: at the earliest {_stamp(now + delay)} if it first sees them now (`ipamgc status`: what "
        "it has seen); an orphan still counting addresses is emptied first and deleted one window later; "
        "no IP is freed by a handle repair",
        highlight=False,
    )
