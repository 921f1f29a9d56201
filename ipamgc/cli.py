"""The `ipamgc` command line: one entry point, one subcommand per job (design.md, "Command line")."""

from __future__ import annotations

import sys

import click

from ipamgc import __version__
from ipamgc.check import run_check


@click.group(context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "IPAMGC"})
@click.version_option(__version__, prog_name="ipamgc")
def cli() -> None:
    """ipamgc: a sharded, change-driven garbage collector for Calico IPAM."""


@cli.command()
@click.option(
    "--snapshot",
    "snapshots",
    multiple=True,
    required=True,
    metavar="FILE",
    help="A `kubectl get nodes,pods,ipamblocks,ipamhandles,blockaffinities -A -o json` List; "
    "repeatable; - for stdin.",
)
@click.option("--output", "-o", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option(
    "--leak-grace-period",
    default="15m",
    show_default=True,
    envvar="IPAMGC_LEAK_GRACE_PERIOD",
    help="Go duration (15m, 90s); 0 keeps candidates forever; `none` = Calico's unset (no GC on live nodes).",
)
@click.option("--all", "show_all", is_flag=True, help="Table: list every allocation, not only leaks.")
def check(snapshots: tuple[str, ...], output: str, leak_grace_period: str, show_all: bool) -> None:
    """Audit a cluster snapshot offline: which IPs are leaked and when ipamgc would release them."""
    code = run_check(list(snapshots), output, leak_grace_period, show_all, sys.stdout, sys.stderr)
    sys.exit(code)


def main() -> None:
    cli()
