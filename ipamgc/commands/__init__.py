"""The components as click commands (`ipamgc watch`, `ipamgc work`, …), one module each.

`ipamgc/cli.py` registers them (`cli.add_command(watch)`); `watch` and `work` also run on their own with
`python -m ipamgc.commands.watch` / `python -m ipamgc.commands.work` (tests and benchmarks start them
that way).  Flags win over `IPAMGC_*` environment variables (read by `shared.config.from_env`), which
win over the defaults; an option not given is `None` and leaves the setting alone.  Logging is set up
here, in the entry points only: text for a terminal, JSON lines for a log pipeline.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from shared.config import Settings, from_env
from shared.errors import ConfigError

F = TypeVar("F", bound=Callable[..., Any])

# LogRecord attributes that are not `extra` context.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and the `extra` context fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def common_options(func: F) -> F:
    """Options every component takes."""
    options = [
        click.option(
            "--redis-url",
            default=None,
            allow_from_autoenv=False,
            help="Redis URL (redis://, rediss://, unix://). [env: IPAMGC_REDIS_URL, REDIS_URL]",
        ),
        click.option(
            "--prefix", default=None, allow_from_autoenv=False, help="Redis key prefix. [env: IPAMGC_PREFIX]"
        ),
        click.option(
            "--shards-count",
            type=click.IntRange(min=1),
            default=None,
            allow_from_autoenv=False,
            help="Number of shards (4); must match the Redis data. [env: IPAMGC_SHARDS]",
        ),
        click.option(
            "--log-level",
            type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
            default="INFO",
            show_default=True,
            allow_from_autoenv=False,
        ),
        click.option(
            "--log-format",
            type=click.Choice(["text", "json"]),
            default="text",
            show_default=True,
            allow_from_autoenv=False,
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def load_settings(**flags: Any) -> Settings:
    """`from_env()` with the given flags on top; a ConfigError becomes a usage error (exit 2)."""
    try:
        return from_env().with_overrides(**flags)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from exc
