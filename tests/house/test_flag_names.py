"""One meaning per flag: every option of every command (`ipamgc --help`, each subcommand's, `ipamgc chaos`'s
argparse options and `python -m ipamgc.dashboard`) must be a canonical name of this table, each name with
one meaning and each meaning with one name; an option of a kind the table does not say (`--output` that is
not a format, `--shard-count` that is not a count) fails; and every old spelling maps to a canonical name
the command has, prints one deprecation line and keeps working."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import click
import pytest
from click.testing import CliRunner

from ipamgc.cli import cli
from ipamgc.commands.flags import REMOVAL, Command, rewrite
from ipamgc.dashboard import main as dashboard
from lab.chaos.runner import RENAMED as CHAOS_RENAMED
from lab.chaos.runner import build_parser

# name → (meaning, kind); kind: "format" (a Choice of formats), "path", "count" (an int), "flag", "" (any).
CANONICAL: dict[str, tuple[str, str]] = {
    "--all": ("health: every heartbeat under the prefix", "flag"),
    "--api-faults": ("fault rules of the simulated API server", ""),
    "--batch-size": ("allocations per worker batch", "count"),
    "--backstop": ("what the watcher's periodic backstop runs", ""),
    "--batch-wait": ("the watcher's batch wait", ""),
    "--burst": ("a worker exits when its queues are empty", "flag"),
    "--calico-api-group": ("the API group of Calico's objects", ""),
    "--churn": ("pod events per second of the simulated churn", ""),
    "--churn-seconds": ("length of bench's churn phase", ""),
    "--cluster": ("a cluster, by API server URL or kube-system uid", ""),
    "--calico-kube-controllers": ("Calico's kube-controllers binary (or NAME=PATH,…)", "path"),
    "--kube-apiserver": (
        "a directory with bin/kube-apiserver and bin/etcd (bench against a real server)",
        "path",
    ),
    "--calico-leak-grace-period": ("bench --mode calico: the grace of its cost run", ""),
    "--backstop-passes": ("bench: periodic passes measured per collector", "count"),
    "--calico-backstop-leak-grace-period": ("bench --mode calico: the grace of its backstop run", ""),
    "--compare": ("a previous bench report to compare with", "path"),
    "--conflicts-seconds": ("bench: length of the conflicts phase", ""),
    "--deleted-node-rate-limit": ("the leader's releases per second of deleted nodes' IPs", ""),
    "--node-churn": ("bench: a node-churn preset", "format"),
    "--node-churn-periods": ("bench: periods of node churn", ""),
    "--generate": ("compare: how many random clusters", "count"),
    "--component": ("the component a heartbeat belongs to", ""),
    "--context": ("kubeconfig context", ""),
    "--dry-run": ("decide and record, write nothing to Kubernetes", "flag"),
    "--duration": ("seconds to run", ""),
    "--election": ("elect one active watcher with a Lease", "flag"),
    "--faults": ("chaos: the kinds of fault injected", ""),
    "--from-report": ("an ipamgc check JSON report to release from", ""),
    "--full-scan-max-pods": ("bench: skip full-scan above this many pods", "count"),
    "--host": ("listen address of a server", ""),
    "--identity": ("holder identity in the Lease", ""),
    "--instance": ("the process instance of a heartbeat", ""),
    "--interval": ("seconds between refreshes", ""),
    "--job-budget": ("time a shard job works before re-enqueueing", ""),
    "--job-idle": ("time an idle lingering shard job waits", ""),
    "--kick-interval": ("how often candidates whose grace ended are re-checked", ""),
    "--kubeconfig": ("kubeconfig file of the cluster", "path"),
    "--kubeconfig-out": ("where to write a kubeconfig of the simulated cluster", ""),
    "--kubevirt": ("KubeVirt is installed / served", "flag"),
    "--kubelet-delay": ("seconds a simulated kubelet takes to confirm a graceful pod deletion", ""),
    "--leader": ("bench runs the leader", "flag"),
    "--leak-grace-period": ("Calico's leak grace period", ""),
    "--leaked-handles": ("bench: leaked IPAMHandles of the handle collector's scenario", "count"),
    "--leak-rate": ("fraction of pod deletions that leak", ""),
    "--lease-name": ("name of the Lease", ""),
    "--leader-lease-name": ("combined: name of the leader's Lease (the watcher's is --lease-name)", ""),
    "--lease-namespace": ("namespace of the Lease", ""),
    "--limit": ("the newest N records", "count"),
    "--log-dir": ("directory of the components' logs", ""),
    "--log-format": ("log line format", "format"),
    "--log-level": ("log level", "format"),
    "--max-age": ("the oldest age accepted of what is read", ""),
    "--metrics-host": ("listen address of /metrics", ""),
    "--metrics-port": ("port of /metrics", "count"),
    "--mode": ("bench modes", ""),
    "--name": ("RQ worker name", ""),
    "--no-handle-gc": ("the leader's handle collector off", "flag"),
    "--node-loss": ("bench: nodes lost", "count"),
    "--node-loss-pods": ("bench: pods on each lost node", "count"),
    "--nodes": ("nodes of the simulated cluster", ""),
    "--idle-seconds": ("length of bench's idle phase", ""),
    "--output": ("the format printed on stdout", "format"),
    "--output-file": ("a file the full output is written to", ""),
    "--page": ("list page size", ""),
    "--pods-per-node": ("pods per node of the simulated cluster", ""),
    "--pod-size": ("size of the simulated cluster's pods: small, real or large", "format"),
    "--port": ("listen port of a server", ""),
    "--prefix": ("Redis key prefix", ""),
    "--probe": ("liveness or readiness", "format"),
    "--profile": ("bench: py-spy profiles here", "path"),
    "--quiet": ("no progress lines", "flag"),
    "--rate-limit": ("the leader's IP releases per second", ""),
    "--redis-url": ("the Redis URL", ""),
    "--worker-redis-url": ("combined: the worker's Redis URL (the watcher's is --redis-url)", ""),
    "--leader-redis-url": ("combined: the leader's Redis URL (the watcher's is --redis-url)", ""),
    "--resync-period": ("the watcher's backstop period", ""),
    "--runs": ("chaos runs", ""),
    "--seed": ("seed of everything random", ""),
    "--soak": ("chaos: the soak instead of the fault schedule", "flag"),
    "--soak-compress": ("chaos --soak: every period divided by", ""),
    "--soak-max-slope": ("chaos --soak: growth allowed after the warm-up, % an hour", ""),
    "--shard-count": ("number of shards", "count"),
    "--shards": ("a list of shards to work", ""),
    "--show-all-ips": ("list every allocation, not only leaks", "flag"),
    "--snapshot": ("a kubectl List file", ""),
    "--timeout": ("how long to wait for an answer", ""),
    "--vms": ("KubeVirt VMs to create", ""),
    "--watch": ("refresh until Ctrl-C", "flag"),
    "--work-lease": ("how long a batch may stay unacked", ""),
    "--workers": ("worker processes", "count"),
    "--version": ("print the version", "flag"),
    "--watcher-url": ("the watcher's Redis URL", ""),
    "--worker-url": ("a worker's Redis URL", ""),
    "--leader-url": ("the leader's Redis URL", ""),
    "--reader-url": ("the reader's Redis URL", ""),
    "--url-prefix": ("serve under this path", ""),
}
SHORT = {"-o": "--output", "-q": "--quiet", "-h": "--help"}  # a short name always stands for one long name


def _commands() -> Iterator[tuple[str, click.Command]]:
    def walk(cmd: click.Command, path: str) -> Iterator[tuple[str, click.Command]]:
        yield path, cmd
        if isinstance(cmd, click.Group):
            for name, sub in cmd.commands.items():
                yield from walk(sub, f"{path} {name}")

    yield from walk(cli, "ipamgc")
    yield "python -m ipamgc.dashboard", dashboard


def _kind_of(opt: click.Option) -> str:
    if opt.is_flag:
        return "flag"
    if isinstance(opt.type, click.Choice):
        return "format"
    if isinstance(opt.type, click.Path):
        return "path"
    if isinstance(opt.type, click.types.IntParamType):
        return "count"
    return ""


def test_the_table_gives_each_meaning_one_name() -> None:
    meanings = [m for m, _ in CANONICAL.values()]
    assert len(meanings) == len(set(meanings))


@pytest.mark.parametrize(
    ("path", "command"), list(_commands()), ids=lambda v: v if isinstance(v, str) else ""
)
def test_every_option_is_a_canonical_name_of_its_kind(path: str, command: click.Command) -> None:
    for param in command.params:
        if not isinstance(param, click.Option) or param.hidden:
            continue
        longs = [o for o in param.opts if o.startswith("--")]
        assert len(longs) == 1, f"{path}: {param.opts} are two names for one option"
        name = longs[0]
        assert name in CANONICAL, f"{path}: {name} is not in the table of canonical names"
        for short in (o for o in param.opts if not o.startswith("--")):
            assert SHORT.get(short) == name, f"{path}: {short} stands for {SHORT.get(short)}, not {name}"
        wanted = CANONICAL[name][1]
        if (path, name) == ("ipamgc check", "--output"):
            wanted = ""  # a format, or calicoctl's `-o FILE`: test_check_calicoctl_output
        got = _kind_of(param)
        assert not wanted or got == wanted or (wanted == "path" and got == ""), (
            f"{path}: {name} is a {got or 'text'} option, the table says {wanted}"
        )


def test_chaos_options_are_canonical_too() -> None:
    for action in build_parser()._actions:
        for opt in action.option_strings:
            if opt.startswith("--") and opt != "--help":
                assert opt in CANONICAL, f"ipamgc chaos: {opt} is not in the table"
            elif not opt.startswith("--"):
                assert opt == "-h"


def test_output_is_always_a_format() -> None:
    for path, command in _commands():
        for p in command.params:
            if isinstance(p, click.Option) and "--output" in p.opts and path != "ipamgc check":
                assert isinstance(p.type, click.Choice), f"{path}: --output is not a format"
    # check's --output is a format, or calicoctl's `-o FILE` (tested in test_check_calicoctl_output).


@pytest.mark.parametrize(
    ("path", "command"), list(_commands()), ids=lambda v: v if isinstance(v, str) else ""
)
def test_old_spellings_map_to_the_commands_canonical_names(path: str, command: click.Command) -> None:
    renamed = command.renamed if isinstance(command, Command) else {}
    names = {o for p in command.params for o in p.opts + p.secondary_opts}
    for old, new in renamed.items():
        assert new[0] in names, f"{path}: {old} → {new[0]}, which it does not have"
        assert old not in names, f"{path}: {old} is still an option of its own"
    for new in CHAOS_RENAMED.values():
        assert any(new[0] in a.option_strings for a in build_parser()._actions)


def test_an_old_spelling_prints_one_deprecation_line_and_is_rewritten(
    capsys: pytest.CaptureFixture[str],
) -> None:
    bench = cli.commands["bench"]
    assert isinstance(bench, Command)
    args = rewrite(
        "ipamgc bench", ["--grace", "2s", "--grace=3s", "-o", "x.json", "--", "--grace"], bench.renamed
    )
    assert args == [
        "--leak-grace-period",
        "2s",
        "--leak-grace-period=3s",
        "--output-file",
        "x.json",
        "--",
        "--grace",
    ]
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"ipamgc bench: --grace is deprecated; use --leak-grace-period ({REMOVAL})",
        f"ipamgc bench: -o is deprecated; use --output-file ({REMOVAL})",
    ]


@pytest.mark.parametrize(
    ("path", "command"), list(_commands()), ids=lambda v: v if isinstance(v, str) else ""
)
def test_dash_h_prints_the_help_everywhere(path: str, command: click.Command) -> None:
    if path == "ipamgc chaos":
        return  # argparse's own -h, checked below
    args = path.split()[1:] if path.startswith("ipamgc") else None
    target = cli if args is not None else command
    result = CliRunner().invoke(target, [*(args or []), "-h"])
    assert result.exit_code == 0 and "Usage:" in result.output, (path, result.output)


def test_dash_h_of_chaos_and_the_dashboard_module() -> None:
    for argv in (["-m", "ipamgc", "chaos", "-h"], ["-m", "ipamgc.dashboard", "-h"]):
        done = subprocess.run(
            [sys.executable, *argv], capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0 and "usage" in done.stdout.lower(), done.stderr
