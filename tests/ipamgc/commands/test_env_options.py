"""Every option of the component commands (`watch`, `work`, `lead`) can be set from the environment, as
a Helm chart or a compose file sets it (issue 45): its help names the variable, and the variables that
click reads itself (`envvar=`) reach the command's parameters."""

from __future__ import annotations

import click
import pytest

from ipamgc.commands.lead import lead
from ipamgc.commands.watch import watch
from ipamgc.commands.work import work


@pytest.mark.parametrize("command", [watch, work, lead], ids=lambda c: c.name)
def test_every_option_names_its_environment_variable(command: click.Command) -> None:
    for param in command.params:
        if not isinstance(param, click.Option):
            continue
        help_text = param.help or ""
        assert "[env: " in help_text, (command.name, param.opts)
        if param.envvar:
            assert f"[env: {param.envvar}]" in help_text, (command.name, param.opts)


@pytest.mark.parametrize(
    ("command", "env", "name", "expected"),
    [
        (lead, {"IPAMGC_RATE_LIMIT": "7.5"}, "rate_limit", 7.5),
        (lead, {"IPAMGC_DRY_RUN": "true"}, "dry_run", True),
        (lead, {"IPAMGC_LEADER_LEASE_NAME": "gc-leader"}, "lease_name", "gc-leader"),
        (lead, {"IPAMGC_LOG_LEVEL": "DEBUG"}, "log_level", "DEBUG"),
        (watch, {"IPAMGC_LOG_FORMAT": "json"}, "log_format", "json"),
        (watch, {"IPAMGC_KUBE_CONTEXT": "prod"}, "kube_context", "prod"),
        (work, {"IPAMGC_WORK_SHARDS": "0,2"}, "shard_list", "0,2"),
        (work, {"IPAMGC_WORK_BURST": "1"}, "burst", True),
        (work, {"IPAMGC_WORKER_NAME": "w-1"}, "name", "w-1"),
    ],
)
def test_the_environment_reaches_the_parameter(
    monkeypatch: pytest.MonkeyPatch, command: click.Command, env: dict[str, str], name: str, expected: object
) -> None:
    ctx = command.make_context(command.name, [])
    default = ctx.params[name]
    assert default != expected
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert command.make_context(command.name, []).params[name] == expected
    # the flag still wins over the environment
    if name == "rate_limit":
        assert command.make_context(command.name, ["--rate-limit", "3"]).params[name] == 3.0
