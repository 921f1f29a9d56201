"""`ipamgc status`: shards, queues, workers, leader, candidates and releases, from Redis alone.

The Redis is `--redis-url`, else `IPAMGC_REDIS_URL`/`REDIS_URL`, else the running `ipamgc up`'s when
exactly one runs (`ipamgc.local_redis.resolve`; else it asks for the URL); which one, and why, is said on
stderr every time.  Any Redis failure, a timeout included, is one line and exit 2; a Redis without ipamgc's
keys, "no ipamgc data in this Redis" and exit 1.
"""

from __future__ import annotations

import json
import time

import click
import redis
from rich.console import Console
from rich.live import Live

from ipamgc.commands import open_reader, redis_failed, require_data
from ipamgc.commands.flags import Command
from ipamgc.status import read_status
from ipamgc.statusview import render
from shared.keys import Keys


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
