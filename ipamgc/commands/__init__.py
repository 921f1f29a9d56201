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
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click
import redis

from redisio.client import redis_client
from shared.acl import PLACEHOLDER_HINT, placeholder_password
from shared.calicogroup import CalicoGroup, parse_group
from shared.config import Settings, env_calico_group, from_env
from shared.errors import ConfigError
from shared.keys import Keys

if TYPE_CHECKING:
    from ipamgc.local_redis import RedisTarget

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


def option_group(*options: Callable[[F], F]) -> Callable[[F], F]:
    """Several options as one decorator, listed as they would be stacked above a command."""

    def decorate(func: F) -> F:
        for option in reversed(options):
            func = option(func)
        return func

    return decorate


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
            "--shard-count",
            "shards_count",
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
            envvar="IPAMGC_LOG_LEVEL",
            allow_from_autoenv=False,
            help="[env: IPAMGC_LOG_LEVEL]",
        ),
        click.option(
            "--log-format",
            type=click.Choice(["text", "json"]),
            default="text",
            show_default=True,
            envvar="IPAMGC_LOG_FORMAT",
            allow_from_autoenv=False,
            help="[env: IPAMGC_LOG_FORMAT]",
        ),
    ]
    return option_group(*options)(func)


def _calico_group(ctx: click.Context, param: click.Parameter, value: str | None) -> CalicoGroup | None:
    if value is None:
        return None
    try:
        return parse_group(value)
    except ConfigError as exc:
        raise click.BadParameter(str(exc)) from exc


def calico_api_group_option(func: F) -> F:
    """`--calico-api-group`: the API group of Calico's objects (default: as Calico discovers it)."""
    return click.option(
        "--calico-api-group",
        default=None,
        metavar="GROUP/VERSION",
        allow_from_autoenv=False,
        callback=_calico_group,
        help="projectcalico.org/v3 or crd.projectcalico.org/v1 (default: v3 when the API server serves it "
        "and not crd.projectcalico.org, else v1, as Calico chooses). "
        "[env: IPAMGC_CALICO_API_GROUP, CALICO_API_GROUP]",
    )(func)


KUBECONFIG_DEFAULT = "in a pod its service account, else $KUBECONFIG, else ~/.kube/config"


def kubeconfig_option(default_text: str = KUBECONFIG_DEFAULT, env: bool = False) -> Callable[[F], F]:
    """`--kubeconfig PATH`, the same everywhere: unset (or `-`), the client's own default (`default_text`
    says what the command does then)."""
    return click.option(
        "--kubeconfig",
        type=click.Path(dir_okay=False),
        default=None,
        metavar="PATH",
        allow_from_autoenv=False,
        help=f"Kubeconfig file (default: {default_text})." + (" [env: IPAMGC_KUBECONFIG]" if env else ""),
    )


def context_option(func: F) -> F:
    return click.option(
        "--context",
        "kube_context",
        default=None,
        envvar="IPAMGC_KUBE_CONTEXT",
        allow_from_autoenv=False,
        help="Kubeconfig context. [env: IPAMGC_KUBE_CONTEXT]",
    )(func)


def kube_options(func: F) -> F:
    """`--kubeconfig`, `--context` and `--calico-api-group`: how a component reaches the cluster."""
    func = calico_api_group_option(func)
    func = context_option(func)
    return kubeconfig_option(env=True)(func)


def kubeconfig_path(value: str | None) -> str | None:
    """The path to load: None (the client's default) for unset, empty or `-`."""
    return None if value in (None, "", "-") else value


def lease_options(name_default: str | None, name_shown: str) -> Callable[[F], F]:
    """`--lease-namespace`, `--lease-name`, `--identity`: the Lease an elected component holds (the
    watcher's and the leader's are two Leases of one kind).  The watcher's first spellings,
    `--election-namespace` and `--election-name`, are old spellings (`LEASE_RENAMED`).
    `name_default` None: the setting's own (`IPAMGC_ELECTION_NAME`, else `name_shown`)."""

    def decorate(func: F) -> F:
        options = [
            click.option(
                "--lease-namespace",
                "lease_namespace",
                default=None,
                allow_from_autoenv=False,
                help="Namespace of the Lease (kube-system). [env: IPAMGC_ELECTION_NAMESPACE, POD_NAMESPACE]",
            ),
            click.option(
                "--lease-name",
                "lease_name",
                default=name_default,
                # the watcher's is a setting (IPAMGC_ELECTION_NAME); the leader's a flag of its own
                envvar=None if name_default is None else "IPAMGC_LEADER_LEASE_NAME",
                allow_from_autoenv=False,
                help=f"Name of the Lease ({name_shown})."
                + (
                    " [env: IPAMGC_ELECTION_NAME]"
                    if name_default is None
                    else " [env: IPAMGC_LEADER_LEASE_NAME]"
                ),
            ),
            click.option(
                "--identity",
                default=None,
                allow_from_autoenv=False,
                help="Holder identity in the Lease (default: hostname-pid-random). "
                "[env: IPAMGC_ELECTION_IDENTITY, POD_NAME]",
            ),
        ]
        return option_group(*options)(func)

    return decorate


def resolve_calico_group(flag: CalicoGroup | None) -> CalicoGroup | None:
    """The flag, else the environment (`check`, `release`: commands that read no other setting there)."""
    if flag is not None:
        return flag
    try:
        return env_calico_group()
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from exc


def load_settings(**flags: Any) -> Settings:
    """`from_env()` with the given flags on top; a ConfigError becomes a usage error (exit 2), a
    placeholder Redis password a one-line refusal (exit 2)."""
    try:
        settings = from_env().with_overrides(**flags)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from exc
    refuse_placeholder_password(settings.redis_url)
    return settings


def refuse_placeholder_password(url: str, command: str | None = None) -> None:
    """Exit 2 with one line on stderr when the Redis URL carries deploy/'s placeholder password
    (`change-me-…`): the Secret was applied as shipped, and its passwords are public.  `command` names
    the command in that line (default: the running click command's path)."""
    if not placeholder_password(url):
        return
    ctx = click.get_current_context(silent=True)
    name = command or "ipamgc"
    if command is None and ctx is not None:  # `python -m ipamgc.commands.health` is `ipamgc health`
        name = ctx.command_path if ctx.command_path.startswith("ipamgc") else f"ipamgc {ctx.command.name}"
    click.echo(f"{name}: error: the Redis URL's password is a placeholder ({PLACEHOLDER_HINT})", err=True)
    sys.exit(2)


# -- the read-only commands' Redis (`status`, `audit`) ------------------------------------------------

REDIS_TIMEOUT_SECONDS = 5.0  # a Redis that accepts and never answers: one line, not a hang or a traceback


def open_reader(prog: str, flag: str | None) -> tuple[redis.Redis, RedisTarget]:
    """The Redis `prog` reads (`ipamgc.local_redis.resolve`, named on stderr), with timeouts; exit 2 with
    one line when none can be chosen or the URL is not one."""
    from ipamgc.local_redis import NoRedisTarget, redact, resolve  # noqa: PLC0415 - not for the probes

    try:
        target = resolve(flag)
    except NoRedisTarget as exc:
        click.echo(f"{prog}: error: {exc}", err=True)
        sys.exit(2)
    refuse_placeholder_password(target.url, prog)
    click.echo(f"{prog}: {target.describe()}", err=True)
    try:
        client = redis_client(
            target.url, socket_connect_timeout=REDIS_TIMEOUT_SECONDS, socket_timeout=REDIS_TIMEOUT_SECONDS
        )
    except ValueError as exc:
        click.echo(f"{prog}: error: {redact(target.url)} is not a Redis URL: {exc}", err=True)
        sys.exit(2)
    return client, target


def redis_failed(prog: str, target: RedisTarget, exc: redis.RedisError) -> NoReturn:
    """Any Redis failure (refused, timed out, auth, …): one line, exit 2."""
    detail = " ".join(str(exc).split()) or type(exc).__name__
    click.echo(f"{prog}: error: {target.describe()}: {type(exc).__name__}: {detail}", err=True)
    sys.exit(2)


def require_data(prog: str, client: redis.Redis, keys: Keys) -> None:
    """Exit 1 with "no ipamgc data in this Redis" when no key of ipamgc's is there under the prefix."""
    found = client.exists(keys.state, keys.audit, keys.cluster, keys.decisions, keys.blocks)
    if not found:
        click.echo(f"{prog}: no ipamgc data in this Redis (prefix {keys.prefix!r})", err=True)
        sys.exit(1)
