"""deploy/'s Secret ships `change-me-<component>` Redis passwords.  Applied as shipped, nothing may run on
them: every ipamgc command that connects to Redis with one refuses to start, with one line on stderr and
exit status 2, before it connects (the refusal needs no Redis: the URLs below point at a closed port, and
a command that went on would fail differently).  A real password goes past the check."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from ipamgc.cli import cli
from shared.acl import placeholder_password
from tests.deploy.conftest import ROOT, Obj, find

CLOSED = "127.0.0.1:9"  # discard: nothing listens there on the test machine
PLACEHOLDER = f"redis://watcher:change-me-watcher@{CLOSED}/0"
LINE = "error: the Redis URL's password is a placeholder"


def _env(url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("IPAMGC_") and k != "REDIS_URL"}
    env["REDIS_URL"] = url
    return env


def _one_line(stderr: str, command: str) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f'{command}: {LINE} (it starts with "change-me"'), lines[0]


@pytest.mark.parametrize(
    "url",
    [
        "redis://watcher:change-me-watcher@ipamgc-redis:6379/0",  # deploy/'s, as shipped
        "rediss://:change-me@redis:6380/0",  # password only, TLS
        "redis://worker:CHANGE-ME-worker@redis/0",  # any case
        "redis://leader:change%2Dme-leader@redis/0",  # percent-encoded
        "unix:///run/redis.sock?password=change-me-reader&db=0",  # redis-py's query parameter
    ],
)
def test_placeholder_passwords_are_recognised(url: str) -> None:
    assert placeholder_password(url)


@pytest.mark.parametrize(
    "url",
    [
        "redis://watcher:9f2c4be1d0a7@ipamgc-redis:6379/0",
        "redis://watcher:changeme@redis/0",  # not the placeholder's spelling: an operator's choice
        "redis://watcher:my-change-me@redis/0",
        "redis://change-me@redis/0",  # a user name, no password
        "redis://127.0.0.1:6379/0",
        "unix:///run/redis.sock",
        "not a url at all",
    ],
)
def test_other_passwords_are_not(url: str) -> None:
    assert not placeholder_password(url)


def test_the_shipped_secret_holds_only_placeholders(manifests: list[Obj]) -> None:
    """The check recognises exactly what deploy/redis.yaml ships (a new placeholder would be caught here)."""
    [secret] = find(manifests, "Secret", "ipamgc-redis")
    urls = secret["stringData"].values()
    assert urls and all(placeholder_password(u) for u in urls)


@pytest.mark.parametrize(
    "args",
    [
        ["watch"],
        ["work"],
        ["lead"],
        ["status"],
        ["health", "--component", "worker"],
        ["audit"],
        ["up"],
    ],
    ids=lambda a: a[0],
)
def test_each_command_refuses_a_placeholder_in_redis_url(args: list[str]) -> None:
    result = CliRunner().invoke(cli, args, env=_env(PLACEHOLDER))
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    lines = [ln for ln in result.stderr.strip().splitlines() if LINE in ln]
    assert lines == [
        f'ipamgc {args[0]}: {LINE} (it starts with "change-me"; put your own in the Secret, '
        "e.g. `openssl rand -hex 24`)"
    ], result.stderr


def test_the_flag_and_ipamgc_redis_url_are_checked_too() -> None:
    runner = CliRunner()
    flag = runner.invoke(cli, ["work", "--redis-url", PLACEHOLDER], env=_env(f"redis://{CLOSED}/0"))
    assert flag.exit_code == 2 and LINE in flag.stderr
    env = _env(f"redis://{CLOSED}/0") | {"IPAMGC_REDIS_URL": PLACEHOLDER}
    assert runner.invoke(cli, ["lead"], env=env).exit_code == 2


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        # what the containers run: the image's entry point, and the probes' `python -m` form
        ([sys.executable, "-m", "ipamgc", "watch", "--log-format", "json"], "ipamgc watch"),
        (
            [sys.executable, "-m", "ipamgc.commands.health", "--component", "leader", "--probe", "readiness"],
            "ipamgc health",
        ),
        ([sys.executable, "-m", "ipamgc.dashboard"], "python -m ipamgc.dashboard"),
    ],
    ids=["watch", "probe", "dashboard"],
)
def test_the_processes_the_pods_run_refuse_with_one_line(argv: list[str], command: str) -> None:
    done = subprocess.run(
        argv, check=False, cwd=ROOT, env=_env(PLACEHOLDER), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    _one_line(done.stderr, command)


def test_a_real_password_goes_past_the_check() -> None:
    """The same probe with an operator's password reaches Redis: it answers that Redis is unreachable
    (exit 1, Redis at a closed port), not the refusal (exit 2)."""
    url = f"redis://leader:0f3b5d8a2c64e1f9@{CLOSED}/0"
    argv = [sys.executable, "-m", "ipamgc.commands.health", "--component", "leader", "--probe", "readiness"]
    done = subprocess.run(
        argv, check=False, cwd=ROOT, env=_env(url), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1, done.stderr
    assert LINE not in done.stderr
