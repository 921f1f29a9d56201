"""docs/runbooks.md's steps can be followed: every `ipamgc` command in its code blocks parses (options that
exist, values they accept), every object a `kubectl -n ipamgc` line names exists in deploy/ under that
name, and no step restarts Redis without saying what that loses (issue 45)."""

from __future__ import annotations

import re
import shlex

import click
import pytest

from ipamgc.cli import cli
from tests.deploy.conftest import ROOT, load_manifests

RUNBOOKS = ROOT / "docs" / "runbooks.md"


def _code_lines() -> list[str]:
    lines, fenced = [], False
    for line in RUNBOOKS.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif fenced:
            lines.append(line.split("  #")[0].strip())
    return lines


def runbook_commands() -> list[list[str]]:
    out = []
    for line in _code_lines():
        for part in re.split(r"\s*(?:\||>|&&)\s*", line):
            if part.startswith("ipamgc "):
                out.append(shlex.split(part)[1:])
    return out


def test_the_runbooks_have_their_commands() -> None:
    commands = {argv[0] for argv in runbook_commands()}
    assert {"status", "audit", "health", "check", "release"} <= commands


@pytest.mark.parametrize("argv", runbook_commands(), ids=" ".join)
def test_every_ipamgc_command_of_the_runbooks_parses(argv: list[str]) -> None:
    command = cli.commands[argv[0]]
    assert isinstance(command, click.Command)
    command.make_context(argv[0], argv[1:])  # a wrong option or value raises a UsageError


def test_every_object_named_by_kubectl_exists_in_deploy() -> None:
    names = {(o["kind"], o["metadata"]["name"]) for o in load_manifests()}
    deployments = {n for k, n in names if k == "Deployment"}
    text = "\n".join(_code_lines()) + RUNBOOKS.read_text()
    for name in re.findall(r"deploy/(ipamgc-[a-z]+)", text):
        assert name in deployments, name
    for name in re.findall(r"statefulset/(ipamgc-[a-z]+)", text):
        assert ("StatefulSet", name) in names, name
    for name in re.findall(r"get secret (ipamgc-redis[a-z-]*)", text):
        assert ("Secret", name) in names or name == "ipamgc-redis-reader", name  # the chart's per-component
    # the Leases whose holder the runbooks read are the components' (their --lease-name defaults)
    assert set(re.findall(r"get lease (ipamgc-[a-z]+)", text)) <= {"ipamgc-watcher", "ipamgc-leader"}


def test_no_step_restarts_redis_without_saying_what_it_loses() -> None:
    text = RUNBOOKS.read_text()
    sections = re.split(r"^## ", text, flags=re.MULTILINE)
    for section in sections:
        if "restart statefulset/ipamgc-redis" in section:
            assert "what-a-redis-restart-loses" in section, section.splitlines()[0]
