"""`ipamgc audit`: print the leader's audit stream (every release and refusal).

`--output table` (default), `json` (one JSON document: `{"redis": …, "records": […], "unreadable": N,
"gaps": […]}`, also when there are no records) or `ndjson` (one record per line, for streaming into other
tools).  Records lost from the stream (a failover or rollback that lost writes, a write Redis refused)
leave gaps in their sequence numbers (`workers/leader/audit_seq.py`): each gap among the records read is
one line on stderr, "N records lost between seq A and B" (and `gaps` in the JSON document); the lost
records themselves are the leader's `ipamgc.audit` log lines with those numbers.  The
Redis is found as `ipamgc status` finds it (`ipamgc.local_redis.resolve`) and named on stderr.
"""

from __future__ import annotations

import sys
import time

import click
import orjson
import redis
from rich.console import Console
from rich.table import Table

from ipamgc.commands import (
    common_options,
    configure_logging,
    load_settings,
    open_reader,
    redis_failed,
    require_data,
)
from ipamgc.commands.flags import COMMON_RENAMED, Command
from ipamgc.local_redis import redact
from workers.leader.audit import AuditRecord, Result, read_audit
from workers.leader.audit_seq import find_gaps

_STYLE = {
    Result.RELEASED: "green",
    Result.ALREADY_FREE: "cyan",
    Result.REFUSED_VALID: "yellow",
    Result.REFUSED_CONFLICT: "yellow",
    Result.HELD_BY_HANDLE: "blue",
    Result.STALE_EPOCH: "red",
    Result.DRY_RUN: "magenta",
    Result.ERROR: "red",
    Result.REPAIRED: "cyan",
}


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(at)) + f".{int(at % 1 * 1000):03d}Z"


def _or_dash(text: str) -> str:
    return text or "-"


def render_table(records: list[AuditRecord], console: Console) -> None:
    table = Table(title=f"ipamgc audit ({len(records)} records)", show_lines=False)
    for column in ("time", "result", "ip", "node", "block", "handle", "rule", "reason", "epoch", "cluster"):
        table.add_column(column, overflow="fold")
    for r in records:
        handle = r.handle if len(r.handle) <= 40 else r.handle[:37] + "…"
        table.add_row(
            _when(r.at),
            f"[{_STYLE[r.result]}]{r.result}[/]",
            _or_dash(r.ip),
            _or_dash(r.node),
            _or_dash(r.block),
            _or_dash(handle),
            _or_dash(r.rule),
            _or_dash(r.reason),
            str(r.epoch) if r.epoch else "-",
            _or_dash(r.cluster),
        )
    console.print(table)


@click.command("audit", cls=Command, renamed={**COMMON_RENAMED})
@common_options
@click.option(
    "--output",
    "-o",
    type=click.Choice(["table", "json", "ndjson"]),
    default="table",
    show_default=True,
    help="json: one document; ndjson: one record per line.",
)
@click.option(
    "--cluster",
    default=None,
    metavar="URL|UID",
    help="Only the records made against this cluster: its API server URL or kube-system uid (a prefix of "
    "it is enough).  Records older than the cluster identity name none and are left out.",
)
@click.option(
    "--limit",
    type=click.IntRange(min=0),
    default=100,
    show_default=True,
    help="The newest N records (0: all).",
)
def audit(
    redis_url: str | None,
    prefix: str | None,
    shards_count: int | None,
    log_level: str,
    log_format: str,
    output: str,
    cluster: str | None,
    limit: int,
) -> None:
    """Print what the leader released and refused, newest last.

    Exit 2 with one line when Redis fails (refused, timed out, …), 1 when it holds no ipamgc data."""
    configure_logging(log_level, log_format)
    client, target = open_reader("ipamgc audit", redis_url)
    settings = load_settings(key_prefix=prefix, shards=shards_count)

    def keep(r: AuditRecord) -> bool:
        return cluster is None or (r.identity is not None and r.identity.matches(cluster))

    try:
        require_data("ipamgc audit", client, settings.keys)
        seqs: list[int] = []
        records, bad = read_audit(client, settings.keys, limit or None, keep if cluster else None, seqs)
    except redis.RedisError as exc:
        redis_failed("ipamgc audit", target, exc)
    finally:
        client.close()
    gaps = find_gaps(seqs)
    out = sys.stdout.buffer
    if output == "json":
        doc = {
            "redis": redact(target.url),
            "records": [r.as_json() for r in records],
            "unreadable": bad,
            "gaps": [{"after": g.after, "before": g.before, "lost": g.lost} for g in gaps],
        }
        out.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")
        out.flush()
    elif output == "ndjson":
        for r in records:
            out.write(orjson.dumps(r.as_json()) + b"\n")
        out.flush()
    else:
        # Piped (not a terminal): wide enough that handles and reasons are not folded into slivers.
        render_table(records, Console(width=None if sys.stdout.isatty() else 220))
    if bad:
        click.echo(f"ipamgc audit: {bad} unreadable entries skipped", err=True)
    for gap in gaps:
        click.echo(f"ipamgc audit: {gap} (in the leader's ipamgc.audit log lines)", err=True)


if __name__ == "__main__":
    audit()
