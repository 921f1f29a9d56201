"""One name for one thing across every command, and the old spellings kept for one release.

Every command is a `Command` (or a `Group`): `-h` and `--help` both print its help, also when it runs on
its own (`python -m ipamgc.commands.watch -h`), and its `renamed` table maps an old spelling to the
arguments that replace it.  An old spelling still works: it is rewritten before click parses the
arguments, and one line on stderr says so (`ipamgc bench: --grace is deprecated; use
--leak-grace-period`).  The old spellings are not options of their own, so `--help` shows only the
canonical names (tests/house/test_flag_names.py checks every command against one table of them).

To add an option to a command: reuse the canonical name of the same thing (README, "Flags"); to rename
one, add the old spelling to the command's `renamed`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import click

CONTEXT: dict[str, Any] = {"help_option_names": ["-h", "--help"]}
REMOVAL = "the old spelling goes in the next release"

# Shared by every component that takes `common_options`.
COMMON_RENAMED: dict[str, tuple[str, ...]] = {"--shards-count": ("--shard-count",)}
# The watcher's and the leader's (`lease_options`).
LEASE_RENAMED: dict[str, tuple[str, ...]] = {
    "--election-namespace": ("--lease-namespace",),
    "--election-name": ("--lease-name",),
}


def rewrite(
    prog: str, args: Sequence[str], renamed: Mapping[str, tuple[str, ...]], warn: bool = True
) -> list[str]:
    """`args` with each old spelling replaced (`--old v`, `--old=v`); one stderr line per old spelling
    used.  Nothing after `--` is touched."""
    out: list[str] = []
    said: set[str] = set()
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        if arg == "--":
            out.append(arg)
            out.extend(rest)
            break
        name, eq, value = arg.partition("=")
        new = renamed.get(name) if name.startswith("-") else None
        if new is None:
            out.append(arg)
            continue
        if warn and name not in said:
            said.add(name)
            click.echo(f"{prog}: {name} is deprecated; use {' '.join(new)} ({REMOVAL})", err=True)
        if eq:
            if len(new) != 1:
                raise click.UsageError(f"{name} takes no value")
            out.append(f"{new[0]}={value}")
        else:
            out.extend(new)
    return out


class Command(click.Command):
    """A command with `-h`, and old spellings (`renamed`) rewritten with a deprecation line."""

    def __init__(self, *args: Any, renamed: Mapping[str, tuple[str, ...]] | None = None, **kwargs: Any):
        kwargs.setdefault("context_settings", dict(CONTEXT))
        super().__init__(*args, **kwargs)
        self.renamed: dict[str, tuple[str, ...]] = dict(renamed or {})

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, rewrite(ctx.command_path, args, self.renamed))


class Group(click.Group):
    """A group with `-h`; its subcommands are `Command`s."""

    command_class = Command

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("context_settings", dict(CONTEXT))
        super().__init__(*args, **kwargs)
