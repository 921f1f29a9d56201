"""`ipamgc release --from-report FILE`: release what an `ipamgc check --output json` report marked
`release: now`, as `calicoctl ipam release --from-report` does, through the leader's guards
(`workers/leader/report_release.py`: live block and sequence number, live re-check, handle all-or-none,
conditional writes), with `--dry-run` to see first and one audit record per IP, each naming the cluster
it was made against.  Refused (exit 2, one line) too: a Redis whose watcher collects another cluster
(`P:cluster`, `shared/cluster.py`), so that records never land beside another cluster's.

Refused with exit 2 and one line: a file that is not an ipamgc report (`report.generator` is not
`ipamgc check`, or another format), a report older than `--max-age` (1h by default: long enough to
review a dry run and apply it, short enough that the cluster it describes is still the one being
written; the live checks keep an older report safe, the bound keeps it from being applied by mistake), or
one made more than 5 minutes in the future (a clock that cannot be trusted), and a malformed entry.
Exit 0 when every IP was handled (whatever the result), 1 when one ended in `error`.
"""

from __future__ import annotations

import datetime as dt
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import click
import orjson
import redis
from rich.console import Console
from rich.table import Table

from ipamgc.check import REPORT_FORMAT, REPORT_GENERATOR
from ipamgc.commands import (
    calico_api_group_option,
    configure_logging,
    context_option,
    kubeconfig_option,
    kubeconfig_path,
    refuse_placeholder_password,
    resolve_calico_group,
)
from ipamgc.commands.flags import Command
from ipamgc.local_redis import NoRedisTarget, resolve
from kubeio import client as kubeio_client
from kubeio.cluster import read_identity
from kubeio.errors import KubeError
from redisio.client import redis_client
from shared.calicogroup import CalicoGroup
from shared.cluster import ClusterIdentity, from_mapping, same_cluster
from shared.duration import format_duration, parse_duration
from shared.errors import ConfigError
from shared.keys import Keys
from shared.netaddr import AddressError, canonical_ip, ip_to_ordinal, parse_network
from workers.leader import kube
from workers.leader.audit import Result
from workers.leader.report_release import ReportEntry, release_report

DEFAULT_MAX_AGE = "1h"
FUTURE_SKEW_SECONDS = 300.0
EXIT_OK, EXIT_ERRORS, EXIT_REFUSED = 0, 1, 2


class ReportRefused(Exception):
    """The report cannot be used; the message is the one line to print."""


def _generated_at(header: dict[str, Any], path: str) -> float:
    text = header.get("generated_at")
    if not isinstance(text, str):
        raise ReportRefused(f"{path}: the report has no generated_at")
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise ReportRefused(f"{path}: generated_at {text!r} is not a time") from exc
    if when.tzinfo is None:
        raise ReportRefused(f"{path}: generated_at {text!r} has no time zone")
    return when.timestamp()


def load_report(path: str, max_age: float, now: float) -> tuple[list[ReportEntry], dict[str, Any]]:
    """The entries marked `release: now` and the report's header; ReportRefused otherwise."""
    try:
        doc = orjson.loads(Path(path).read_bytes() if path != "-" else sys.stdin.buffer.read())
    except OSError as exc:
        raise ReportRefused(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except orjson.JSONDecodeError as exc:
        raise ReportRefused(f"{path}: not JSON: {exc}") from exc
    header = doc.get("report") if isinstance(doc, dict) else None
    if not isinstance(header, dict) or header.get("generator") != REPORT_GENERATOR:
        raise ReportRefused(
            f"{path}: not an ipamgc report (no report.generator {REPORT_GENERATOR!r}); make one with "
            "`ipamgc check --kubeconfig PATH --output json > report.json` (calicoctl's own reports go "
            "to `calicoctl ipam release --from-report`)"
        )
    if header.get("format") != REPORT_FORMAT:
        raise ReportRefused(
            f"{path}: report format {header.get('format')!r}, this ipamgc reads {REPORT_FORMAT}"
        )
    made = _generated_at(header, path)
    if now - made > max_age:
        raise ReportRefused(
            f"{path}: the report is {format_duration(now - made)} old (made {header['generated_at']}), "
            f"more than --max-age {format_duration(max_age)}: make a fresh one with `ipamgc check`"
        )
    if made - now > FUTURE_SKEW_SECONDS:
        raise ReportRefused(
            f"{path}: the report is made in the future ({header['generated_at']}): check the clocks"
        )
    allocations = doc.get("allocations")
    if not isinstance(allocations, list):
        raise ReportRefused(f"{path}: the report has no allocations list")
    entries = []
    for i, a in enumerate(allocations):
        if not isinstance(a, dict):
            raise ReportRefused(f"{path}: allocations[{i}] is not an object")
        if a.get("release") != "now":
            continue
        entries.append(_entry(a, f"{path}: allocations[{i}]"))
    return entries, {"file": path, "generated_at": header["generated_at"], "source": header.get("source", "")}


def _entry(a: dict[str, Any], where: str) -> ReportEntry:
    fields = {k: a.get(k) for k in ("ip", "block", "handle", "node", "reason")}
    if not all(isinstance(v, str) and v for v in fields.values()):
        raise ReportRefused(f"{where}: ip, block, handle, node and reason must be non-empty strings")
    seq = a.get("sequence_number")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
        raise ReportRefused(f"{where}: no sequence_number (a report of an older ipamgc? make a fresh one)")
    if a.get("valid") is not False:
        raise ReportRefused(f"{where}: marked release now but not invalid")
    try:
        ip = canonical_ip(str(fields["ip"]))
        ip_to_ordinal(parse_network(str(fields["block"])), ip)
    except (AddressError, ValueError) as exc:
        raise ReportRefused(f"{where}: {exc}") from exc
    return ReportEntry(
        ip, str(fields["block"]), str(fields["handle"]), str(fields["node"]), seq, str(fields["reason"])
    )


def _same_cluster_or_exit(
    api: kubeio_client.ApiClient, client: redis.Redis, keys: Keys, where: str
) -> ClusterIdentity:
    """This command's cluster; exit 2 (one line) when the Redis's watcher collects another one."""
    try:
        mine = read_identity(api)
        theirs = from_mapping(client.hgetall(keys.cluster))
    except KubeError as exc:
        click.echo(f"ipamgc release: error: cannot read the cluster: {exc}", err=True)
        sys.exit(EXIT_REFUSED)
    except redis.RedisError as exc:
        click.echo(f"ipamgc release: error: {where}: {exc}", err=True)
        sys.exit(EXIT_REFUSED)
    if theirs is not None and not same_cluster(mine, theirs):
        click.echo(
            f"ipamgc release: error: {where} collects another cluster ({theirs.describe()}) than the "
            f"kubeconfig reaches ({mine.describe()}): give --redis-url of this cluster's ipamgc",
            err=True,
        )
        sys.exit(EXIT_REFUSED)
    return mine


@click.command("release", cls=Command)
@click.option(
    "--from-report",
    "report_path",
    required=True,
    metavar="FILE",
    help="An `ipamgc check --output json` report; - for stdin.",
)
@click.option(
    "--dry-run", is_flag=True, help="Check everything, write nothing (audit records say what would happen)."
)
@kubeconfig_option()
@context_option
@calico_api_group_option
@click.option(
    "--redis-url",
    default=None,
    allow_from_autoenv=False,
    help="Where the audit records go, found as `ipamgc audit` finds it ($IPAMGC_REDIS_URL, $REDIS_URL, "
    "else the running `ipamgc up`'s when exactly one runs); refused when its watcher collects another "
    "cluster.",
)
@click.option(
    "--prefix", default="ipamgc", show_default=True, envvar="IPAMGC_PREFIX", help="Redis key prefix."
)
@click.option(
    "--max-age",
    default=DEFAULT_MAX_AGE,
    show_default=True,
    help="Refuse a report older than this (Go duration).",
)
@click.option("--output", "-o", type=click.Choice(["table", "json"]), default="table", show_default=True)
def release(
    report_path: str,
    dry_run: bool,
    kubeconfig: str | None,
    kube_context: str | None,
    calico_api_group: CalicoGroup | None,
    redis_url: str | None,
    prefix: str,
    max_age: str,
    output: str,
) -> None:
    """Release the IPs a `check --output json` report marked `release: now`, each re-checked live."""
    configure_logging("WARNING", "text")
    try:
        bound = parse_duration(max_age)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--max-age") from exc
    try:
        entries, report = load_report(report_path, bound, time.time())
    except ReportRefused as exc:
        click.echo(f"ipamgc release: error: {exc}", err=True)
        sys.exit(EXIT_REFUSED)
    try:
        target = resolve(redis_url)
    except NoRedisTarget as exc:
        click.echo(f"ipamgc release: error: {exc} (where the audit records go)", err=True)
        sys.exit(EXIT_REFUSED)
    refuse_placeholder_password(target.url)
    click.echo(f"ipamgc release: audit records to {target.describe()}", err=True)
    if not entries:
        click.echo("ipamgc release: the report marks nothing `release: now`; nothing to do", err=True)
        sys.exit(EXIT_OK)
    client = redis_client(target.url)
    try:
        client.ping()
    except redis.RedisError as exc:
        click.echo(
            f"ipamgc release: error: cannot reach {target.describe()} for the audit records: {exc}", err=True
        )
        sys.exit(EXIT_REFUSED)
    try:
        api_client = kubeio_client.api_client(
            kubeconfig_path(kubeconfig), kube_context, user_agent="ipamgc-release"
        )
    except ConfigError as exc:
        client.close()
        click.echo(f"ipamgc release: error: {exc}", err=True)
        sys.exit(EXIT_REFUSED)
    try:
        mine = _same_cluster_or_exit(api_client, client, Keys(prefix), target.describe())
        records = release_report(
            entries,
            kube.CalicoApi(api_client, calico=resolve_calico_group(calico_api_group)),
            client,
            Keys(prefix),
            dry_run=dry_run,
            report=report,
            cluster=mine,
        )
    finally:
        api_client.close()
        client.close()
    if output == "json":
        click.echo(
            orjson.dumps(
                {"dry_run": dry_run, "records": [r.as_json() for r in records]}, option=orjson.OPT_INDENT_2
            ).decode()
        )
    else:
        table = Table(title=f"ipamgc release --from-report {report_path}" + (" (dry run)" if dry_run else ""))
        for col in ("ip", "result", "node", "handle", "reason"):
            table.add_column(col, overflow="fold")
        for r in records:
            table.add_row(r.ip, str(r.result), r.node or "-", r.handle or "-", r.reason or "-")
        Console(width=None if sys.stdout.isatty() else 200).print(table)
    counts = Counter(str(r.result) for r in records)
    click.echo("ipamgc release: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())), err=True)
    sys.exit(EXIT_ERRORS if counts.get(Result.ERROR.value) else EXIT_OK)
