"""Which Redis `status` and `audit` read: the flag, else the environment, else a running `up`'s
announcement, else the default; a dead `up`'s announcement is ignored; a password is never printed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ipamgc.local_redis import NoRedisTarget, announce, redact, resolve, running_ups, withdraw


def test_the_flag_then_the_environment_then_a_running_up_then_the_default(tmp_path: Path) -> None:
    env = {"IPAMGC_RUNTIME_DIR": str(tmp_path)}
    with pytest.raises(NoRedisTarget, match="no `ipamgc up` is running"):  # never a guessed 127.0.0.1:6379
        resolve(None, env)
    path = announce("redis://127.0.0.1:4242/0", tmp_path / "logs", env)
    target = resolve(None, env)
    assert target.url == "redis://127.0.0.1:4242/0"
    assert (
        target.describe()
        == f"Redis redis://127.0.0.1:4242/0 (the only running `ipamgc up`, pid {os.getpid()})"
    )
    assert resolve(None, {**env, "REDIS_URL": "redis://r:1/0"}).source == "$REDIS_URL"
    both = {**env, "REDIS_URL": "redis://r:1/0", "IPAMGC_REDIS_URL": "redis://i:1/0"}
    assert resolve(None, both).url == "redis://i:1/0"
    assert resolve("redis://f:1/0", both).describe() == "Redis redis://f:1/0 (--redis-url)"
    withdraw(path)
    with pytest.raises(NoRedisTarget):
        resolve(None, env)


def test_an_announcement_of_an_up_that_is_gone_is_ignored(tmp_path: Path) -> None:
    env = {"IPAMGC_RUNTIME_DIR": str(tmp_path)}
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True
    )
    pid = int(dead.stdout)  # exited: no process has that pid now (pids are not re-used this soon)
    (tmp_path / f"up-{pid}.json").write_text(json.dumps({"redis_url": "redis://gone:1/0", "pid": pid}))
    (tmp_path / "up-garbage.json").write_text("{not json")
    assert running_ups(env) == []
    with pytest.raises(NoRedisTarget):
        resolve(None, env)


def test_a_password_is_redacted_wherever_a_url_is_printed(tmp_path: Path) -> None:
    assert redact("redis://:s3cret@10.0.0.1:6379/0") == "redis://:***@10.0.0.1:6379/0"
    assert redact("rediss://user:s3cret@host/1") == "rediss://user:***@host/1"
    assert redact("unix:///tmp/redis.sock") == "unix:///tmp/redis.sock"
    env = {"IPAMGC_RUNTIME_DIR": str(tmp_path)}
    path = announce("redis://u:s3cret@127.0.0.1:1/0", tmp_path, env)
    assert "s3cret" not in resolve(None, env).describe()
    assert path.stat().st_mode & 0o077 == 0  # the announcement itself is the user's only
