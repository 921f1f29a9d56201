"""Every Redis client ipamgc builds: RESP2 pinned, bytes replies, no `CLIENT SETINFO`, Sentinel URLs followed.

Why a module: redis-py 8 speaks RESP3 by default, and every reply this code decodes is a RESP2 shape, so
each client is built with `CLIENT_OPTIONS` (`redis_client`), and a blocking command (XREAD BLOCK,
BZPOPMIN) gets a client of its own whose socket outwaits its block (`blocking_client`).  The settings that
name the server (`Settings.redis_url`) are pure and stay in `shared.config`.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import redis
import redis.connection
from redis.sentinel import SentinelConnectionPool

from redisio.sentinel import blocking_pool, is_sentinel_url, sentinel_client
from shared.errors import ConfigError


def _without_client_setinfo() -> dict[str, Any]:
    """The keyword arguments that stop redis-py sending `CLIENT SETINFO LIB-NAME/LIB-VER` on connect.

    Why: one round trip less per connection, and no refusal in the ACL log (`ACL LOG`) of Redis >= 7.2 or
    Valkey, which know the command and refuse it to ipamgc's users: shared/acl.py cannot grant it,
    since Redis 7.0 does not know the command and rejects an ACL file that names it.  redis-py 8 takes
    `driver_info=None` (and deprecates `lib_name`/`lib_version` with a warning); redis-py 5-7 know only
    `lib_name=None, lib_version=None`.  Decided once, from the connection class's signature."""
    parameters = inspect.signature(redis.connection.AbstractConnection.__init__).parameters
    if "driver_info" in parameters:
        return {"driver_info": None}
    return {"lib_name": None, "lib_version": None}


# Keyword arguments of every Redis client ipamgc builds (`redis.Redis(host=..., **CLIENT_OPTIONS)`):
# RESP2 pinned, bytes replies, no CLIENT SETINFO.
CLIENT_OPTIONS: Mapping[str, Any] = MappingProxyType(
    {"protocol": 2, "decode_responses": False, **_without_client_setinfo()}
)


def blocking_client(client: redis.Redis, longest: float) -> redis.Redis:
    """A client on `client`'s server and settings whose socket waits `longest` seconds plus a margin, for
    one blocking command (XREAD BLOCK, BZPOPMIN) at a time: redis-py 8's default socket timeout (5 s)
    would end a longer block with a TimeoutError.  Its own pool: the blocked connection is nobody else's."""
    pool = client.connection_pool
    options = {**pool.connection_kwargs, "socket_timeout": longest + BLOCKING_MARGIN_SECONDS}
    if isinstance(pool, SentinelConnectionPool):  # the same master, followed through failovers
        return redis.Redis(connection_pool=blocking_pool(pool, options))
    return redis.Redis(connection_pool=type(pool)(connection_class=pool.connection_class, **options))


# How much longer than its longest block a blocking client's socket waits for the reply.
BLOCKING_MARGIN_SECONDS = 10.0


def redis_client(url: str, **options: Any) -> redis.Redis:
    """A client for `url` (`redis://`, `rediss://` (TLS; `?ssl_ca_certs=/path/ca.pem`), `unix://`, or a
    Sentinel-managed master: `redis+sentinel://host:26379,host2:26379/mymaster[/db]`, `redisio/sentinel.py`)
    with `CLIENT_OPTIONS`; `options` (timeouts, ...) are passed on to redis-py.  A Sentinel URL whose
    sentinels do not answer or do not know the master raises ConfigError."""
    if is_sentinel_url(url):
        return sentinel_client(url, {**CLIENT_OPTIONS, **options})
    try:
        return redis.Redis.from_url(url, **{**CLIENT_OPTIONS, **options})
    except ValueError as exc:  # an unknown scheme, a bad port or option: the URL, not the server
        raise ConfigError(f"Redis URL: {exc}") from exc
