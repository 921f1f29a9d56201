"""The `ipamgc` command line: one entry point, one subcommand per job (design.md, "Command line")."""

from __future__ import annotations

import importlib
import sys
from collections.abc import ItemsView, Iterator, ValuesView
from typing import Any

import click

from ipamgc import __version__
from ipamgc.commands.flags import CONTEXT
from shared.errors import ConfigError

# Each subcommand's module, imported only when that command runs (or is listed): a component process
# (`ipamgc work`, `watch`, `lead`) imports its own command, not the benchmark, the simulator or the
# Kubernetes client it does not use (`ipamgc work` started in ~1 s of CPU, most of it imports).
LAZY: dict[str, str] = {
    "audit": "ipamgc.commands.audit:audit",
    "check": "ipamgc.commands.check:check",
    "bench": "ipamgc.commands.bench:bench",
    "chaos": "ipamgc.commands.chaos:chaos",
    "compare": "ipamgc.commands.compare:compare",
    "demo": "ipamgc.commands.demo:demo",
    "health": "ipamgc.commands.health:health",
    "lead": "ipamgc.commands.lead:lead",
    "redis-acl": "ipamgc.commands.redis_acl:redis_acl",
    "release": "ipamgc.commands.release:release",
    "sim": "ipamgc.commands.sim:sim",
    "status": "ipamgc.commands.status:status",
    "up": "ipamgc.commands.up:up",
    "watch": "ipamgc.commands.watch:watch",
    "work": "ipamgc.commands.work:work",
}


class _LazyCommands(dict[str, click.Command]):
    """The group's `commands`: every name present, its module imported on first access."""

    def __init__(self, lazy: dict[str, str]) -> None:
        super().__init__()
        self.lazy = dict(lazy)

    def _load(self, name: str) -> click.Command:
        module, _, attr = self.lazy.pop(name).partition(":")
        command = getattr(importlib.import_module(module), attr)
        assert isinstance(command, click.Command)
        super().__setitem__(name, command)
        return command

    def __getitem__(self, name: str) -> click.Command:
        if name in self.lazy:
            return self._load(name)
        return super().__getitem__(name)

    def get(self, name: str, default: Any = None) -> Any:
        if name not in self:
            return default
        return self[name]

    def __contains__(self, name: object) -> bool:
        return name in self.lazy or super().__contains__(name)

    def __iter__(self) -> Iterator[str]:
        return iter(sorted({*super().keys(), *self.lazy}))

    def __len__(self) -> int:
        return len(super().keys() | self.lazy.keys())

    def keys(self) -> Any:
        return list(self)

    def items(self) -> ItemsView[str, click.Command]:  # type: ignore[override]
        for name in list(self.lazy):
            self._load(name)
        return super().items()

    def values(self) -> ValuesView[click.Command]:  # type: ignore[override]
        for name in list(self.lazy):
            self._load(name)
        return super().values()


class _Cli(click.Group):
    """Subcommands loaded lazily (`LAZY`); settings no command caught (a Redis URL refused when its
    client is built: a Sentinel that does not answer, an unknown master): one line and exit 2, never a
    traceback."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands = _LazyCommands(LAZY)

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
