"""The `ipamgc` command line: one entry point, one subcommand per job (design.md, "Command line")."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, ItemsView, Iterator, ValuesView
from typing import Any

import click

from ipamgc import __version__
from ipamgc.commands.flags import CONTEXT
from shared.errors import ConfigError

# Each subcommand's module, imported only when that command runs (or is listed): a component process
# (`ipamgc work`, `watch`, `lead`) imports its own command, not the benchmark, the simulator or the
# Kubernetes client it does not use (`ipamgc work` started in ~1 s of CPU, most of it imports).  The
# lab's commands (`bench`, `chaos`, `compare`, `demo`, `sim`) are the lab's own table (`lab_commands`).
LAZY: dict[str, str] = {
    "audit": "ipamgc.commands.audit:audit",
    "check": "ipamgc.commands.check:check",
    "combined": "ipamgc.commands.combined:combined",
    "health": "ipamgc.commands.health:health",
    "lead": "ipamgc.commands.lead:lead",
    "redis-acl": "ipamgc.commands.redis_acl:redis_acl",
    "release": "ipamgc.commands.release:release",
    "status": "ipamgc.commands.status:status",
    "up": "ipamgc.commands.up:up",
    "watch": "ipamgc.commands.watch:watch",
    "work": "ipamgc.commands.work:work",
}


def lab_commands() -> dict[str, str]:
    """The lab's subcommands, from its one table (`lab.commands.COMMANDS`): the one place the product
    reaches the lab (an import-linter contract allows this edge alone).  Read only when a command the
    product does not own is asked for, or the list is shown, so a component process never imports it."""
    from lab.commands import COMMANDS  # noqa: PLC0415 - the lab only when one of its commands is asked for

    return COMMANDS


class _LazyCommands(dict[str, click.Command]):
    """The group's `commands`: every name present, its module imported on first access; `more` (the
    lab's table) read the first time a name is not in `lazy`, or the whole list is wanted."""

    def __init__(self, lazy: dict[str, str], more: Callable[[], dict[str, str]]) -> None:
        super().__init__()
        self.lazy = dict(lazy)
        self.more: Callable[[], dict[str, str]] | None = more

    def _add_more(self) -> None:
        if self.more is not None:
            more, self.more = self.more, None
            self.lazy.update({name: path for name, path in more().items() if name not in self.lazy})

    def _load(self, name: str) -> click.Command:
        module, _, attr = self.lazy.pop(name).partition(":")
        command = getattr(importlib.import_module(module), attr)
        assert isinstance(command, click.Command)
        super().__setitem__(name, command)
        return command

    def __getitem__(self, name: str) -> click.Command:
        if name not in self.lazy and not super().__contains__(name):
            self._add_more()
        if name in self.lazy:
            return self._load(name)
        return super().__getitem__(name)

    def get(self, name: str, default: Any = None) -> Any:
        if name not in self:
            return default
        return self[name]

    def __contains__(self, name: object) -> bool:
        if name in self.lazy or super().__contains__(name):
            return True
        self._add_more()
        return name in self.lazy

    def __iter__(self) -> Iterator[str]:
        self._add_more()
        return iter(sorted({*super().keys(), *self.lazy}))

    def __len__(self) -> int:
        self._add_more()
        return len(super().keys() | self.lazy.keys())

    def keys(self) -> Any:
        return list(self)

    def items(self) -> ItemsView[str, click.Command]:  # type: ignore[override]
        self._add_more()
        for name in list(self.lazy):
            self._load(name)
        return super().items()

    def values(self) -> ValuesView[click.Command]:  # type: ignore[override]
        self._add_more()
        for name in list(self.lazy):
            self._load(name)
        return super().values()


class _Cli(click.Group):
    """Subcommands loaded lazily (`LAZY`, then the lab's `lab_commands`); settings no command caught (a
    Redis URL refused when its client is built: a Sentinel that does not answer, an unknown master): one
    line and exit 2, never a traceback."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands = _LazyCommands(LAZY, lab_commands)

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except ConfigError as exc:
            name = ctx.invoked_subcommand or ctx.info_name or "ipamgc"
            click.echo(f"ipamgc {name}: {exc}", err=True)
            sys.exit(2)


@click.group(cls=_Cli, context_settings={**CONTEXT, "auto_envvar_prefix": "IPAMGC"})
@click.version_option(__version__, prog_name="ipamgc")
def cli() -> None:
    """ipamgc: a sharded, change-driven garbage collector for Calico IPAM."""


def main() -> None:
    cli()
