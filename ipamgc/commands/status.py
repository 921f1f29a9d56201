"""`ipamgc status`: shards, queues, workers, leader, candidates and releases, from Redis alone.

The Redis is `--redis-url`, else `IPAMGC_REDIS_URL`/`REDIS_URL`, else the running `ipamgc up`'s when
exactly one runs (`ipamgc.local_redis.resolve`; else it asks for the URL); which one, and why, is said on
stderr every time.  Any Redis failure, a timeout included, is one line and exit 2; a Redis without ipamgc's
keys, "no ipamgc data in this Redis" and exit 1.
"""

from __future__ import annotations

import json
import time
from typing import Any

import click
import redis
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from ipamgc.commands import open_reader, redis_failed, require_data
from ipamgc.commands.flags import Command
from ipamgc.status import Status, read_status
from shared.keys import Keys


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
    for col in ("shard", "dirty", "in-flight", "candidates", "due", "queued jobs"):
        shards.add_column(col, justify="right")
    for s in status.shards:
        shards.add_row(*(str(v) for v in (s.shard, s.dirty, s.inflight, s.candidates, s.due, s.queue)))
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


@click.command("status", cls=Command)
@click.option(
    "--redis-url",
    default=None,
    allow_from_autoenv=False,
    help="Default: $IPAMGC_REDIS_URL, $REDIS_URL, else the running `ipamgc up`'s when exactly one runs.",
)
@click.option(
    "--prefix", default="ipamgc", envvar="IPAMGC_PREFIX", show_default=True, help="Redis key prefix."
)
@click.option("--output", "-o", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--watch", "watch_", is_flag=True, help="Refresh every --interval seconds until Ctrl-C.")
@click.option("--interval", default=2.0, show_default=True, help="Seconds between refreshes (--watch).")
def status(redis_url: str | None, prefix: str, output: str, watch_: bool, interval: float) -> None:
    """Per shard dirty / in-flight / queue depth, workers, leader, candidates, releases.

    Exit 2 with one line when Redis fails (refused, timed out, …), 1 when it holds no ipamgc data."""
    client, target = open_reader("ipamgc status", redis_url)
    keys = Keys(prefix)
    try:
        require_data("ipamgc status", client, keys)
        if output == "json":
            while True:
                click.echo(json.dumps(read_status(client, keys).to_json()))
                if not watch_:
                    return
                time.sleep(interval)  # the refresh period of a display, not a wait for a condition
        console = Console()
        if not watch_:
            console.print(render(read_status(client, keys)))
            return
        with Live(render(read_status(client, keys)), console=console, refresh_per_second=4) as live:
            while True:
                time.sleep(interval)
                live.update(render(read_status(client, keys)))
    except redis.RedisError as exc:
        redis_failed("ipamgc status", target, exc)
    except KeyboardInterrupt:
        pass
    finally:
        client.close()
