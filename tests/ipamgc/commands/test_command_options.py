"""`ipamgc watch` and `ipamgc lead` declare how they reach the cluster and their Lease once
(`ipamgc.commands.kube_options`, `lease_options`): the same flags, spelled the same, in both."""

from __future__ import annotations

import click

from ipamgc.commands.lead import lead
from ipamgc.commands.watch import watch

SHARED = ("kubeconfig", "kube_context", "calico_api_group", "lease_namespace", "lease_name", "identity")


def _params(command: click.Command) -> dict[str, click.Parameter]:
    return {p.name: p for p in command.params if p.name is not None}


def test_watch_and_lead_share_their_cluster_and_lease_flags() -> None:
    w, ld = _params(watch), _params(lead)
    for name in SHARED:
        assert w[name].opts == ld[name].opts, name
        assert w[name].type.to_info_dict() == ld[name].type.to_info_dict(), name
    assert w["lease_namespace"].opts == ["--lease-namespace"]
    assert w["lease_name"].opts == ["--lease-name"]
    # The watcher's Lease name defaults to its setting (IPAMGC_ELECTION_NAME, else ipamgc-watcher); the
    # leader's is its own.
    assert w["lease_name"].default is None
    assert ld["lease_name"].default == "ipamgc-leader"


def test_the_watchers_first_spellings_still_parse() -> None:
    ctx = watch.make_context(
        "watch", ["--election-namespace", "ns", "--election-name", "n", "--identity", "me"]
    )
    assert (ctx.params["lease_namespace"], ctx.params["lease_name"], ctx.params["identity"]) == (
        "ns",
        "n",
        "me",
    )
    ctx = watch.make_context("watch", ["--lease-namespace", "ns2", "--lease-name", "n2"])
    assert (ctx.params["lease_namespace"], ctx.params["lease_name"]) == ("ns2", "n2")
