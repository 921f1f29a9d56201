"""`ipamgc work`: an RQ worker validating shard jobs (what a worker container runs)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import click
import redis

from ipamgc.commands import F, common_options, configure_logging, load_settings, option_group
from ipamgc.commands.flags import COMMON_RENAMED, Command
from ipamgc.metrics import metrics_port_option, resolve_metrics_port
from ipamgc.runner import Process, run_process
from redisio.client import redis_client
from shared.config import Settings, parse_seconds
from shared.errors import ConfigError
from workers.shards.run import parse_shards, run_workers


def _seconds(value: str | None) -> float | None:
    try:
        return None if value is None else parse_seconds(value)
    except (ConfigError, ValueError) as exc:
        raise click.BadParameter(str(exc)) from exc


def worker_options(func: F) -> F:
    """The RQ worker's flags `ipamgc combined` takes too: the batch size and the worker's name."""
    options = [
        click.option(
            "--batch-size",
            type=click.IntRange(min=1),
            default=None,
            allow_from_autoenv=False,
            help="Allocations per batch. [env: IPAMGC_BATCH_SIZE]",
        ),
        click.option(
            "--name",
            default=None,
            envvar="IPAMGC_WORKER_NAME",
            allow_from_autoenv=False,
            help="RQ worker name (default: random). [env: IPAMGC_WORKER_NAME]",
        ),
    ]
    return option_group(*options)(func)


@click.command("work", cls=Command, renamed={**COMMON_RENAMED, "--lease": ("--work-lease",)})
@common_options
@click.option(
    "--shards",
    "shard_list",
    default=None,
    metavar="LIST",
    envvar="IPAMGC_WORK_SHARDS",
    allow_from_autoenv=False,
    help="Shards to work, e.g. 0,1,5-7 (default: all). [env: IPAMGC_WORK_SHARDS]",
)
@click.option(
    "--burst",
    is_flag=True,
    envvar="IPAMGC_WORK_BURST",
    allow_from_autoenv=False,
    help="Exit when the queues are empty. [env: IPAMGC_WORK_BURST]",
)
@worker_options
@click.option(
    "--work-lease",
    "lease",
    default=None,
    allow_from_autoenv=False,
    help="How long a batch may stay unacked before another job redoes it (60s). [env: IPAMGC_WORK_LEASE]",
)
@click.option(
    "--job-budget",
    default=None,
    allow_from_autoenv=False,
    help="Time a shard job works before re-enqueueing itself (5s). [env: IPAMGC_JOB_BUDGET]",
)
@click.option(
    "--job-idle",
    default=None,
    allow_from_autoenv=False,
    help="Time a lingering shard job waits with nothing to do before it ends (10s). [env: IPAMGC_JOB_IDLE]",
)
@metrics_port_option
def work(
    redis_url: str | None,
    prefix: str | None,
    shards_count: int | None,
    log_level: str,
    log_format: str,
    shard_list: str | None,
    burst: bool,
    batch_size: int | None,
    lease: str | None,
    job_budget: str | None,
    job_idle: str | None,
    name: str | None,
    metrics_port: int | None,
    metrics_host: str | None,
) -> None:
    """Validate dirty allocations of some or all shards and emit release decisions."""
    port = resolve_metrics_port(metrics_port)
    settings = load_settings(
        redis_url=redis_url,
        key_prefix=prefix,
        shards=shards_count,
        batch_size=batch_size,
        work_lease_seconds=_seconds(lease),
        job_budget_seconds=_seconds(job_budget),
        job_idle_seconds=_seconds(job_idle),
    )
    try:
        shards = None if shard_list is None else parse_shards(shard_list, settings.shards)
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--shards") from exc
    configure_logging(log_level, log_format)
    # The validation counters are kept in Redis by every worker and served by the active watcher
    # (workers/shards/metrics.py); a worker's own /metrics carries its process metrics.
    run_process("work", _opened(settings, shards, burst, name), settings.keys, port, metrics_host)


class WorkerProcess(Process):
    """RQ workers as the runner runs them: they handle SIGTERM and SIGINT themselves (after the current
    job), so the runner installs no stop signal; alive while running."""

    component = "worker"
    handles_stop_signals = False

    def __init__(
        self, client: redis.Redis, settings: Settings, shards: list[int] | None, burst: bool, name: str | None
    ) -> None:
        super().__init__(client)
        self.settings, self.shards, self.burst, self.name = settings, shards, burst, name

    def run(self) -> int:
        run_workers(self.settings, self.shards, self.burst, name=self.name)
        return 0


@contextlib.contextmanager
def _opened(
    settings: Settings, shards: list[int] | None, burst: bool, name: str | None
) -> Iterator[WorkerProcess]:
    client = redis_client(settings.redis_url)  # the heartbeat's
    try:
        yield WorkerProcess(client, settings, shards, burst, name)
    finally:
        client.close()


if __name__ == "__main__":
    work()
