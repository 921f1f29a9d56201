"""`ipamgc health`: the liveness and readiness probe of a component, from its heartbeat key in Redis.

Each component process rewrites `P:health:<component>:<instance>` every 5 s (TTL 30 s) while its main
loop comes round (`ipamgc/metrics.py`); the probe runs in the same container, so it resolves the same
instance name (`IPAMGC_INSTANCE`, `POD_NAME`, hostname) and reads the same `REDIS_URL`.  Exit status 0
healthy, 1 not, with one line saying why:
- readiness: the heartbeat exists and is fresh, and Redis answers;
- liveness: the same, except that an unreachable Redis passes: restarting the process would not bring
  Redis back, and the process retries Redis on its own;
- `--all`: every heartbeat under the prefix, listed; healthy when at least one of each component (or of
  `--component`) is fresh.

Probes run often, so this module imports only click, redis and the shared settings: prefer
`python -m ipamgc.commands.health` in probes (a fraction of the start-up of the whole `ipamgc` CLI).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass

import click
import redis

from ipamgc.commands import load_settings
from ipamgc.commands.flags import Command
from ipamgc.metrics import instance_name
from redisio.client import redis_client
from shared import metrics_names as m
from shared.keys import Keys

EXIT_HEALTHY = 0
EXIT_UNHEALTHY = 1


@dataclass(frozen=True, slots=True)
class Beat:
    key: str
    state: str
    age: float
    pid: int

    @classmethod
    def parse(cls, key: str, raw: bytes, now: float) -> Beat:
        """A heartbeat record; unreadable ones read as infinitely old."""
        try:
            doc = json.loads(raw)
            return cls(key, str(doc.get("state", "?")), now - float(doc["at"]), int(doc.get("pid", 0)))
        except (ValueError, TypeError, KeyError):
            return cls(key, "unreadable", float("inf"), 0)


def check_one(client: redis.Redis, keys: Keys, component: str, instance: str, max_age: float) -> Beat | None:
    """The fresh heartbeat of one process, or None (missing, stale or unreadable)."""
    key = keys.health(component, instance)
    raw = client.get(key)
    if not isinstance(raw, bytes):
        return None
    beat = Beat.parse(key, raw, time.time())
    return beat if beat.age <= max_age else None


def check_all(client: redis.Redis, keys: Keys) -> list[Beat]:
    """Every heartbeat under the prefix (expired ones are gone already)."""
    now = time.time()
    out = []
    for key in sorted(client.scan_iter(match=keys.health("*", "*"), count=1000)):
        raw = client.get(key)
        name = key.decode() if isinstance(key, bytes) else str(key)
        if isinstance(raw, bytes):
            out.append(Beat.parse(name, raw, now))
    return out


@click.command("health", cls=Command)
@click.option("--component", type=click.Choice(m.COMPONENTS), default=None, help="The process's component.")
@click.option("--instance", default=None, help="Default: IPAMGC_INSTANCE, else POD_NAME, else the hostname.")
@click.option("--probe", type=click.Choice(["liveness", "readiness"]), default="readiness", show_default=True)
@click.option("--all", "every", is_flag=True, help="List every heartbeat; healthy if each component has one.")
@click.option(
    "--max-age",
    type=click.FloatRange(min=0),
    default=m.HEARTBEAT_TTL_SECONDS,
    show_default=True,
    help="Seconds after which a heartbeat is stale.",
)
@click.option("--timeout", type=click.FloatRange(min=0.1), default=2.0, show_default=True, help="Redis, s.")
@click.option("--redis-url", default=None, help="Redis URL. [env: IPAMGC_REDIS_URL, REDIS_URL]")
@click.option("--prefix", default=None, help="Redis key prefix. [env: IPAMGC_PREFIX]")
def health(
    component: str | None,
    instance: str | None,
    probe: str,
    every: bool,
    max_age: float,
    timeout: float,
    redis_url: str | None,
    prefix: str | None,
) -> None:
    """Exit 0 if the component's heartbeat is fresh (liveness/readiness probe), 1 if not."""
    if component is None and not every:
        raise click.UsageError("give --component (this process) or --all")
    settings = load_settings(redis_url=redis_url, key_prefix=prefix)
    keys = settings.keys
    client = redis_client(settings.redis_url, socket_connect_timeout=timeout, socket_timeout=timeout)
    try:
        if every:
            code = _report_all(client, keys, component, max_age)
        else:
            assert component is not None
            code = _report_one(client, keys, component, instance or instance_name(), probe, max_age)
    except redis.RedisError as exc:
        if probe == "liveness" and not every:
            click.echo(f"alive (not judged: Redis unreachable: {exc})")
            code = EXIT_HEALTHY
        else:
            click.echo(f"unhealthy: Redis unreachable: {exc}")
            code = EXIT_UNHEALTHY
    finally:
        client.close()
    sys.exit(code)


def _report_one(
    client: redis.Redis, keys: Keys, component: str, instance: str, probe: str, age: float
) -> int:
    beat = check_one(client, keys, component, instance, age)
    if beat is None:
        click.echo(f"unhealthy: no fresh heartbeat at {keys.health(component, instance)} (max age {age:g} s)")
        return EXIT_UNHEALTHY
    click.echo(f"{probe} ok: {component} {instance} {beat.state}, beat {beat.age:.1f} s ago (pid {beat.pid})")
    return EXIT_HEALTHY


def _report_all(client: redis.Redis, keys: Keys, component: str | None, age: float) -> int:
    beats = check_all(client, keys)
    fresh: set[str] = set()
    head = keys.health("", "").removesuffix(":")  # `P:health:`
    for b in beats:
        comp, _, inst = b.key.removeprefix(head).partition(":")
        ok = b.age <= age
        if ok:
            fresh.add(comp)
        click.echo(f"{comp:8} {inst:40} {b.state:10} {b.age:6.1f} s {'ok' if ok else 'STALE'}")
    wanted = {component} if component else set(m.COMPONENTS)
    missing = sorted(wanted - fresh)
    if missing:
        click.echo(f"unhealthy: no fresh heartbeat of {', '.join(missing)}")
        return EXIT_UNHEALTHY
    return EXIT_HEALTHY


if __name__ == "__main__":
    health()
