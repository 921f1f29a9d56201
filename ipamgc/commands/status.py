"""`ipamgc status`: shards, queues, workers, leader, candidates and releases, from Redis alone."""

from __future__ import annotations

import json
import time

import click
import redis
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from ipamgc.status import Status, read_status
from shared.keys import Keys


def render(status: Status) -> Group:
    head = Table.grid(padding=(0, 2))
    grace = "unset" if status.leak_grace_period is None else f"{status.leak_grace_period:g}s"
    resync = "never" if status.last_full_resync_age is None else f"{status.last_full_resync_age:.0f}s ago"
    head.add_row(
        f"synced: {'yes' if status.synced else 'no'}",
        f"datastore ready: {'yes' if status.datastore_ready else 'no'}",
        f"grace: {grace}",
        f"last full resync: {resync}",
    )
    leader = status.leader
    head.add_row(
        f"leader: {leader['identity'] or '-'}",
        f"epoch: {leader['epoch']}",
        f"lease age: {leader['lease_age'] if leader['lease_age'] is not None else '-'}s",
        f"heartbeat: {leader['heartbeat_age'] if leader['heartbeat_age'] is not None else '-'}s ago",
    )
    head.add_row(
        f"candidates: {status.totals['candidates']}",
        f"decisions waiting: {status.decisions['pending']} (stream {status.decisions['stream']})",
        "releases: " + (", ".join(f"{k} {v}" for k, v in status.releases.items()) or "none"),
        "",
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
        beat = "-" if w["heartbeat_age"] is None else f"{w['heartbeat_age']}s ago"
        workers.add_row(w["name"][:12], w["state"], beat, str(w["successful_jobs"]), str(w["failed_jobs"]))
    return Group(head, shards, workers)


@click.command("status")
@click.option("--redis-url", default="redis://127.0.0.1:6379/0", envvar=["IPAMGC_REDIS_URL", "REDIS_URL"])
@click.option("--prefix", default="ipamgc", envvar="IPAMGC_PREFIX", show_default=True)
@click.option("--output", "-o", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--watch", "watch_", is_flag=True, help="Refresh every --interval seconds until Ctrl-C.")
@click.option("--interval", default=2.0, show_default=True)
def status(redis_url: str, prefix: str, output: str, watch_: bool, interval: float) -> None:
    """Per shard dirty / in-flight / queue depth, workers, leader, candidates, releases."""
    client = redis.Redis.from_url(redis_url, protocol=2)
    keys = Keys(prefix)
    try:
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
    except redis.ConnectionError as exc:
        raise click.ClickException(f"cannot reach Redis at {redis_url}: {exc}") from exc
    except KeyboardInterrupt:
        pass
    finally:
        client.close()
