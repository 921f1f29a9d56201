"""`ipamgc bench`'s option vocabulary: the callbacks that turn a flag's text into its value (one line and exit
2 when it cannot), and the old spellings still accepted.  The command itself is `lab/commands/bench.py`.
"""

from __future__ import annotations

import click

from lab.bench.config import parse_modes
from lab.kubecontrollers import parse_binaries
from shared.config import parse_seconds
from shared.errors import ConfigError


def seconds(ctx: click.Context, param: click.Parameter, value: str) -> float:
    try:
        return parse_seconds(value)
    except (ConfigError, ValueError) as exc:
        raise click.BadParameter(str(exc)) from exc


def calico_binaries(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> tuple[tuple[str, str], ...]:
    try:
        return tuple((b.name, str(b.path)) for b in parse_binaries(value))
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


def rates(ctx: click.Context, param: click.Parameter, value: str) -> tuple[float, ...]:
    try:
        rates = tuple(float(part) for part in value.split(",") if part.strip())
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected pod events per second, e.g. 50 or 1,5,20,50") from None
    if not rates or any(not r > 0 for r in rates):
        raise click.BadParameter(f"{value!r}: every rate must be a positive number of pod events per second")
    return rates


def modes(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, ...]:
    try:
        return parse_modes(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


# Old spellings (one release): the names every other command uses for the same things.  Options added to
# bench take the canonical name of the same thing (README, "Flags") and go in this table only when renamed.
RENAMED: dict[str, tuple[str, ...]] = {
    "--churn-rate": ("--churn",),
    "--shards": ("--shard-count",),
    "--grace": ("--leak-grace-period",),
    "--leader-rate-limit": ("--rate-limit",),
    "--output": ("--output-file",),
    "-o": ("--output-file",),
}
