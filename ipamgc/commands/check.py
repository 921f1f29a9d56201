"""`ipamgc check`: audit a snapshot or a live cluster (the README's "`ipamgc check`" section)."""

from __future__ import annotations

import sys

import click

from ipamgc import checklive
from ipamgc.calicoswitch import calico_collector
from ipamgc.check import run_check
from ipamgc.commands import (
    calico_api_group_option,
    context_option,
    kubeconfig_option,
    kubeconfig_path,
    resolve_calico_group,
)
from ipamgc.commands.flags import Command
from ipamgc.inventory import fetch_live_inventory
from producer.kubevirt import discover
from shared.calicogroup import CalicoGroup
from shared.errors import IpamgcError

CHECK_FORMATS = ("table", "json")


@click.command(cls=Command, renamed={"--all": ("--show-all-ips",)})
@click.option(
    "--snapshot",
    "snapshots",
    multiple=True,
    metavar="FILE",
    help="A `kubectl get nodes,pods,ipamblocks,ipamhandles,blockaffinities -A -o json` List (with "
    "KubeVirt: and virtualmachines,virtualmachineinstances); repeatable; - for stdin.  Without it: the "
    "live cluster of --kubeconfig.",
)
@kubeconfig_option("in a pod its service account, else $KUBECONFIG, else ~/.kube/config; read-only")
@context_option
@calico_api_group_option
@click.option(
    "--output",
    "-o",
    default="table",
    show_default=True,
    metavar="table|json",
    help="Format on stdout.  calicoctl's `-o FILE` (any other value) writes the JSON report to FILE, as "
    "`calicoctl ipam check -o report.json` does.",
)
@click.option("--output-file", metavar="PATH", default=None, help="Also write the JSON report here.")
@click.option(
    "--leak-grace-period",
    default=None,
    envvar="IPAMGC_LEAK_GRACE_PERIOD",
    help="Go duration (15m, 90s); 0 keeps candidates forever; `none` = Calico's unset (no GC on live nodes). "
    "Default: live, the cluster's KubeControllersConfiguration `default` as the collector reads it; "
    "a snapshot, 15m.",
)
@click.option(
    "--show-all-ips", "show_all", is_flag=True, help="Table: list every allocation, not only leaks."
)
@click.option(
    "--kubevirt/--no-kubevirt",
    default=None,
    help="KubeVirt is installed (VM IPs judged by their VMs and VMIs) or not (VM IPs kept).  Default: "
    "installed when the input holds kubevirt.io objects (live: when the cluster serves them).",
)
def check(
    snapshots: tuple[str, ...],
    kubeconfig: str | None,
    kube_context: str | None,
    calico_api_group: CalicoGroup | None,
    output: str,
    output_file: str | None,
    leak_grace_period: str | None,
    show_all: bool,
    kubevirt: bool | None,
) -> None:
    """Audit a snapshot (or a live cluster): which IPs are leaked and when ipamgc would release them."""
    if snapshots and kubeconfig is not None:
        raise click.UsageError("give either --snapshot FILE (repeatable) or --kubeconfig PATH, not both")
    if output not in CHECK_FORMATS:  # calicoctl's spelling: `-o report.json`
        if output_file is not None:
            raise click.UsageError(
                f"--output {output!r} is a file (calicoctl's spelling) and so is --output-file"
            )
        output, output_file = "table", output
    live = None
    cluster_grace = None
    collector = None
    if not snapshots:
        group = resolve_calico_group(calico_api_group)
        path = kubeconfig_path(kubeconfig)
        try:
            live = fetch_live_inventory(path, kube_context, kubevirt=discover, calico=group)
            kccs = checklive.read_kccs(path, kube_context, group)
            if leak_grace_period is None:
                cluster_grace = checklive.grace_of(kccs)
            collector = calico_collector(kccs)
        except (IpamgcError, OSError) as exc:
            hint = "" if kubeconfig is not None else " (give --snapshot FILE, or --kubeconfig PATH)"
            click.echo(f"ipamgc check: error: cannot read the cluster: {exc}{hint}", err=True)
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
        cluster_grace=cluster_grace,
        output_file=output_file,
        calico_collector=collector,
    )
    sys.exit(code)
