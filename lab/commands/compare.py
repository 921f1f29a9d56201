"""`ipamgc compare`: decision by decision against Calico's own kube-controllers (`lab.compare`)."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path
from typing import Any

import click
import orjson

from ipamgc.commands.flags import Command
from lab.compare.generate import generate_many
from lab.compare.report import to_json, write_table
from lab.compare.run import ClusterResult, compare_cluster
from lab.kubecontrollers import ENV_VAR, HOW_TO_GET, parse_binaries
from shared.duration import parse_duration
from shared.errors import IpamgcError


def _fail(message: str) -> None:
    click.echo(f"ipamgc compare: error: {message}", err=True)
    sys.exit(2)


def _load(path: str) -> list[Any]:
    try:
        doc = orjson.loads(Path(path).read_bytes() if path != "-" else sys.stdin.buffer.read())
    except (OSError, orjson.JSONDecodeError) as exc:
        _fail(f"{path}: cannot read the snapshot: {exc}")
    items = doc.get("items") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        _fail(f"{path}: not a Kubernetes List (no `items`)")
    return list(items)  # type: ignore[arg-type]


@click.command(cls=Command)
@click.option(
    "--snapshot",
    "snapshots",
    multiple=True,
    metavar="FILE",
    help="A cluster in `ipamgc check`'s snapshot format (a `kubectl get … -o json` List); repeatable, each "
    "compared on its own.",
)
@click.option("--generate", "count", type=click.IntRange(min=1), help="Compare N random small clusters.")
@click.option("--seed", default=0, show_default=True, help="Seed of the random clusters.")
@click.option(
    "--calico-kube-controllers",
    "binary",
    envvar=ENV_VAR,
    metavar="PATH",
    help=f"Calico's kube-controllers binary (also ${ENV_VAR}).",
)
@click.option(
    "--leak-grace-period",
    default="5s",
    show_default=True,
    help="The grace period both collectors run with (a Go duration; short: each run lasts until quiet).",
)
@click.option("--output", "-o", type=click.Choice(["table", "json"]), default="table", show_default=True)
def compare(
    snapshots: tuple[str, ...],
    count: int | None,
    seed: int,
    binary: str | None,
    leak_grace_period: str,
    output: str,
) -> None:
    """Collect each cluster twice on a sandboxed simulated cluster, once with Calico's kube-controllers and
    once with ipamgc, and print every allocation, block and affinity whose outcome differs.

    Exit 0 when every difference is a declared one, 1 when any is undeclared, 2 on bad input."""
    try:
        binaries = parse_binaries(binary)
    except ValueError as exc:
        _fail(str(exc))
    if not binaries:
        _fail(HOW_TO_GET)
    if len(binaries) != 1:
        _fail("compare takes one kube-controllers binary (PATH, not NAME=PATH,…)")
    if bool(snapshots) == bool(count):
        click.echo(
            "ipamgc compare: error: give either --snapshot FILE (repeatable) or --generate N", err=True
        )
        sys.exit(2)
    try:
        grace = parse_duration(leak_grace_period)
    except (ValueError, IpamgcError) as exc:
        _fail(f"--leak-grace-period: {exc}")
    if grace <= 0:
        _fail("--leak-grace-period must be above 0 (with 0 Calico collects nothing)")
    clusters: list[tuple[str, list[Any], tuple[str, ...]]] = [(Path(p).stem, _load(p), ()) for p in snapshots]
    if count:
        clusters = [(g.name, g.doc["items"], g.features) for g in generate_many(count, seed)]
    # SIGTERM unwinds like Ctrl-C: every collector process started is stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results: list[ClusterResult] = []
    started = time.time()
    for name, items, features in clusters:
        result = compare_cluster(
            name,
            items,
            binaries[0].path,
            grace,
            leak_grace_period,
            features=features,
            progress=lambda line: click.echo(f"ipamgc compare: {line}", err=True),
        )
        results.append(result)
        click.echo(
            f"ipamgc compare: {name}: {len(result.differences)} differences, {result.undeclared} undeclared",
            err=True,
        )
    if output == "json":
        header = {
            "binary": str(binaries[0].path),
            "leak_grace_period": leak_grace_period,
            "seed": seed if count else None,
            "started": round(started, 3),
            "seconds": round(time.time() - started, 1),
        }
        sys.stdout.buffer.write(orjson.dumps(to_json(results, header), option=orjson.OPT_INDENT_2) + b"\n")
    else:
        write_table(results, sys.stdout)
    sys.exit(1 if any(r.undeclared for r in results) else 0)
