"""The `ipamgc` command line: one entry point, one subcommand per job (design.md, "Command line")."""

from __future__ import annotations

import sys

import click

from ipamgc import __version__
from ipamgc.check import run_check
from ipamgc.commands import calico_api_group_option, resolve_calico_group
from ipamgc.commands.audit import audit
from ipamgc.commands.bench import bench
from ipamgc.commands.chaos import chaos
from ipamgc.commands.compare import compare
from ipamgc.commands.demo import demo
from ipamgc.commands.health import health as check_health
from ipamgc.commands.lead import lead
from ipamgc.commands.redis_acl import redis_acl
from ipamgc.commands.release import release
from ipamgc.commands.sim import sim
from ipamgc.commands.status import status
from ipamgc.commands.up import up
from ipamgc.commands.watch import watch
from ipamgc.commands.work import work
from producer.inventory import fetch_live_inventory
from producer.kubevirt import discover
from shared.calicogroup import CalicoGroup
from shared.errors import IpamgcError


@click.group(context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "IPAMGC"})
@click.version_option(__version__, prog_name="ipamgc")
def cli() -> None:
    """ipamgc: a sharded, change-driven garbage collector for Calico IPAM."""


@cli.command()
@click.option(
    "--snapshot",
    "snapshots",
    multiple=True,
    metavar="FILE",
    help="A `kubectl get nodes,pods,ipamblocks,ipamhandles,blockaffinities -A -o json` List (with "
    "KubeVirt: and virtualmachines,virtualmachineinstances); repeatable; - for stdin.",
)
@click.option(
    "--kubeconfig",
    metavar="PATH",
    help="Audit a live cluster instead (read-only; `-` or empty: $KUBECONFIG / in-cluster).",
)
@click.option("--context", default=None, help="Kubeconfig context (with --kubeconfig).")
@calico_api_group_option
@click.option("--output", "-o", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option(
    "--leak-grace-period",
    default="15m",
    show_default=True,
    envvar="IPAMGC_LEAK_GRACE_PERIOD",
    help="Go duration (15m, 90s); 0 keeps candidates forever; `none` = Calico's unset (no GC on live nodes).",
)
@click.option("--all", "show_all", is_flag=True, help="Table: list every allocation, not only leaks.")
@click.option(
    "--kubevirt/--no-kubevirt",
    default=None,
    help="KubeVirt is installed (VM IPs judged by their VMs and VMIs) or not (VM IPs kept).  Default: "
    "installed when the input holds kubevirt.io objects (with --kubeconfig: when the cluster serves them).",
)
def check(
    snapshots: tuple[str, ...],
    kubeconfig: str | None,
    context: str | None,
    calico_api_group: CalicoGroup | None,
    output: str,
    leak_grace_period: str,
    show_all: bool,
    kubevirt: bool | None,
) -> None:
    """Audit a snapshot (or a live cluster): which IPs are leaked and when ipamgc would release them."""
    if bool(snapshots) == (kubeconfig is not None):
        raise click.UsageError("give either --snapshot FILE (repeatable) or --kubeconfig PATH")
    live = None
    if kubeconfig is not None:
        try:
            live = fetch_live_inventory(
                kubeconfig if kubeconfig not in ("", "-") else None,
                context,
                kubevirt=discover,
                calico=resolve_calico_group(calico_api_group),
            )
        except (IpamgcError, OSError) as exc:
            click.echo(f"ipamgc check: error: cannot read the cluster: {exc}", err=True)
            sys.exit(2)
    code = run_check(
        list(snapshots),
        output,
        leak_grace_period,
        show_all,
        sys.stdout,
        sys.stderr,
        live_items=live,
        kubevirt=kubevirt,
    )
    sys.exit(code)


COMMANDS = (demo, up, watch, work, lead, status, audit, release, check_health, bench, chaos, sim, redis_acl)
for command in COMMANDS:
    cli.add_command(command)
cli.add_command(compare)


def main() -> None:
    cli()
