"""A Sentinel-managed Redis as a URL: `redis+sentinel://[user:password@]host:port[,host:port…]/master[/db]`.

Why a module: an operator whose Redis runs with Sentinel (the common in-cluster chart) or as a managed
service with failover gives every component one URL, as for a plain Redis.  The client asks the
sentinels which server is the master and, after a failover, asks again (redis-py's `SentinelConnectionPool`:
a connection that finds a replica or loses its server looks the master up anew), so a component follows a
failover without a restart.  `rediss+sentinel://` speaks TLS to the sentinels and the servers.  The user
and password are the server's (ipamgc's ACL users, as with a plain URL); sentinels with a password of
their own take `?sentinel_username=…&sentinel_password=…`.  Other query options are redis-py's, as in a
plain URL (`ssl_ca_certs=/path/ca.pem`, `socket_timeout=…`).

A URL that cannot work is refused when the client is built, one line naming why (`ConfigError`, exit 2):
no sentinel answers, or none knows the master's name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import parse_qsl, unquote, urlsplit

import redis
from redis.sentinel import Sentinel, SentinelConnectionPool

from shared.errors import ConfigError

SCHEMES = ("redis+sentinel", "rediss+sentinel")
DEFAULT_PORT = 26379
# How long a sentinel may take to answer (connect and reply) when the master is looked up.
SENTINEL_TIMEOUT_SECONDS = 2.0


def is_sentinel_url(url: str) -> bool:
    return url.split("://", 1)[0].lower() in SCHEMES


@dataclass(frozen=True, slots=True)
class SentinelTarget:
    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    tls: bool = False
    username: str | None = None
    password: str | None = None
    # redis-py connection options from the query string (strings, as `redis.from_url` takes them).
    options: dict[str, str] = field(default_factory=dict)
    sentinel_username: str | None = None
    sentinel_password: str | None = None

    def where(self) -> str:
        return ",".join(f"{h}:{p}" for h, p in self.sentinels)


def parse_sentinel_url(url: str) -> SentinelTarget:
    """The parts of a `redis+sentinel://` URL (ConfigError, naming what is wrong, otherwise)."""
    parts = urlsplit(url)
    if parts.scheme.lower() not in SCHEMES:
        raise ConfigError(f"not a Sentinel URL (redis+sentinel:// or rediss+sentinel://): {url!r}")
    netloc = parts.netloc
    creds, _, hosts = netloc.rpartition("@")
    username = password = None
    if creds:
        user, sep, secret = creds.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if sep else None
    sentinels: list[tuple[str, int]] = []
    for item in (i.strip() for i in hosts.split(",")):
        if item.startswith("["):  # [IPv6]:port
            host, _, rest = item[1:].partition("]")
            port = rest[1:] if rest.startswith(":") else str(DEFAULT_PORT)
        else:
            host, sep, port = item.rpartition(":")
            if not sep:
                host, port = item, str(DEFAULT_PORT)
        if not host:
            raise ConfigError(f"Sentinel URL: an empty sentinel address in {hosts!r}")
        try:
            sentinels.append((host, int(port)))
        except ValueError:
            raise ConfigError(f"Sentinel URL: bad port {port!r} for sentinel {host!r}") from None
    path = [p for p in parts.path.split("/") if p]
    if not path:
        raise ConfigError("Sentinel URL: the master's name is missing (…:26379/mymaster[/db])")
    if len(path) > 2:
        raise ConfigError(f"Sentinel URL: expected /master[/db], got {parts.path!r}")
    try:
        db = int(path[1]) if len(path) == 2 else 0
    except ValueError:
        raise ConfigError(f"Sentinel URL: the database must be a number, got {path[1]!r}") from None
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    sentinel_username = options.pop("sentinel_username", None)
    sentinel_password = options.pop("sentinel_password", None)
    if "db" in options:
        raise ConfigError("Sentinel URL: give the database in the path (/master/db), not as ?db=")
    return SentinelTarget(
        sentinels=tuple(sentinels),
        master=unquote(path[0]),
        db=db,
        tls=parts.scheme.lower() == "rediss+sentinel",
        username=username,
        password=password,
        options=options,
        sentinel_username=sentinel_username,
        sentinel_password=sentinel_password,
    )


def _typed_options(options: dict[str, str]) -> dict[str, Any]:
    """Query options typed as `redis.from_url` types them (numbers and booleans it knows)."""
    parsers: dict[str, object] = redis.connection.URL_QUERY_ARGUMENT_PARSERS
    out: dict[str, Any] = {}
    for name, text in options.items():
        parse = parsers.get(name)
        try:
            out[name] = cast(Callable[[str], Any], parse)(text) if parse is not None else text
        except (TypeError, ValueError):
            raise ConfigError(f"Sentinel URL: bad value {text!r} for {name}") from None
    return out


def sentinel_client(url: str, client_options: dict[str, Any]) -> redis.Redis:
    """A client on the master a Sentinel URL names, following failovers; refused (ConfigError) when no
    sentinel answers or none knows the master."""
    t = parse_sentinel_url(url)
    query = _typed_options(t.options)
    tls: dict[str, Any] = {"ssl": True} if t.tls else {}
    tls.update({k: v for k, v in query.items() if k.startswith("ssl_")})
    sentinel_kwargs: dict[str, Any] = {
        "socket_timeout": SENTINEL_TIMEOUT_SECONDS,
        "socket_connect_timeout": SENTINEL_TIMEOUT_SECONDS,
        "username": t.sentinel_username,
        "password": t.sentinel_password,
        **tls,
    }
    server: dict[str, Any] = {**client_options, **query, **tls, "db": t.db}
    if t.username is not None:
        server["username"] = t.username
    if t.password is not None:
        server["password"] = t.password
    sentinel = Sentinel(list(t.sentinels), sentinel_kwargs=sentinel_kwargs, **server)
    _check(sentinel, t)
    client: redis.Redis = sentinel.master_for(t.master, redis_class=redis.Redis)
    return client


def _check(sentinel: Sentinel, t: SentinelTarget) -> None:
    """Refuse at start what waiting would never fix: no sentinel answers, or none knows the master."""
    answered = False
    errors: list[str] = []
    for s in sentinel.sentinels:
        try:
            addr = s.sentinel_get_master_addr_by_name(t.master)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            errors.append(f"{_addr(s)}: {exc}")
            continue
        except redis.ResponseError as exc:  # e.g. NOAUTH: a sentinel password is needed
            errors.append(f"{_addr(s)}: {exc}")
            continue
        answered = True
        if addr:
            return
    if not answered:
        raise ConfigError(f"no Redis Sentinel answered at {t.where()} ({'; '.join(errors)})")
    raise ConfigError(f"the Sentinels at {t.where()} know no master named {t.master!r}")


def _addr(client: redis.Redis) -> str:
    kw = client.connection_pool.connection_kwargs
    return f"{kw.get('host')}:{kw.get('port')}"


def blocking_pool(pool: SentinelConnectionPool, options: dict[str, Any]) -> SentinelConnectionPool:
    """A pool of its own on the same master, with `options` (the blocking client's socket timeout)."""
    new: SentinelConnectionPool = SentinelConnectionPool(  # type: ignore[no-untyped-call]
        pool.service_name, pool.sentinel_manager, connection_class=pool.connection_class, **options
    )
    return new
