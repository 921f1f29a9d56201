"""Heartbeats and `ipamgc health`: fresh ⇒ 0, missing, stale or stalled ⇒ 1; an unreachable Redis fails
readiness but not liveness; `--all` wants one fresh heartbeat per component."""

from __future__ import annotations

import json
import socket

import click
import pytest
import redis
from click.testing import CliRunner

from ipamgc.commands.health import health
from ipamgc.metrics import Heartbeat, instance_name, resolve_metrics_port
from shared import metrics_names as m
from shared.keys import Keys

KEYS = Keys()


def run(url: str, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(health, ["--redis-url", url, *args])
    return result.exit_code, result.output


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"redis://127.0.0.1:{port}/0"


def test_a_fresh_heartbeat_is_healthy_and_a_stopped_one_is_not(client: redis.Redis, redis_url: str) -> None:
    beat = Heartbeat(client, KEYS, "worker", lambda: (True, "running"), instance="w-1")
    assert beat.beat()
    raw = client.get(KEYS.health("worker", "w-1"))
    assert isinstance(raw, bytes) and json.loads(raw)["state"] == "running"
    assert 0 < client.pttl(KEYS.health("worker", "w-1")) <= m.HEARTBEAT_TTL_SECONDS * 1000
    code, out = run(redis_url, "--component", "worker", "--instance", "w-1")
    assert code == 0, out
    assert "readiness ok: worker w-1 running" in out
    assert run(redis_url, "--component", "worker", "--instance", "w-2")[0] == 1  # another process
    assert run(redis_url, "--component", "leader", "--instance", "w-1")[0] == 1  # another component

    beat.stop()  # a clean stop deletes the key
    code, out = run(redis_url, "--component", "worker", "--instance", "w-1", "--probe", "liveness")
    assert code == 1 and "no fresh heartbeat" in out


def test_a_stale_or_stalled_heartbeat_is_unhealthy(client: redis.Redis, redis_url: str) -> None:
    old = Heartbeat(client, KEYS, "leader", lambda: (True, "leading"), instance="l-1", clock=lambda: 1000.0)
    old.beat()  # written with a timestamp long past, though the key itself has not expired
    assert run(redis_url, "--component", "leader", "--instance", "l-1")[0] == 1
    alive = [True]
    stalled = Heartbeat(client, KEYS, "watcher", lambda: (alive[0], "active"), instance="x-1")
    assert stalled.beat()
    alive[0] = False
    client.delete(KEYS.health("watcher", "x-1"))
    assert not stalled.beat()  # a stalled main loop writes nothing: the key expires, liveness fails
    assert client.get(KEYS.health("watcher", "x-1")) is None


def test_redis_unreachable_fails_readiness_but_not_liveness() -> None:
    url = closed_port_url()
    code, out = run(url, "--component", "watcher", "--probe", "liveness", "--timeout", "0.5")
    assert code == 0 and "not judged" in out
    code, out = run(url, "--component", "watcher", "--probe", "readiness", "--timeout", "0.5")
    assert code == 1 and "Redis unreachable" in out


def test_all_wants_one_fresh_heartbeat_of_each_component(client: redis.Redis, redis_url: str) -> None:
    for component, instance in (("watcher", "a"), ("worker", "b"), ("worker", "c")):
        Heartbeat(client, KEYS, component, lambda: (True, "ok"), instance=instance).beat()
    code, out = run(redis_url, "--all")
    assert code == 1 and "no fresh heartbeat of leader" in out
    assert "worker   c" in out
    assert run(redis_url, "--all", "--component", "worker")[0] == 0
    Heartbeat(client, KEYS, "leader", lambda: (True, "standby"), instance="d").beat()
    assert run(redis_url, "--all")[0] == 0
    assert run(redis_url)[0] == 2  # neither --component nor --all: a usage error


def test_the_instance_is_the_pod_name_unless_told() -> None:
    assert instance_name({"POD_NAME": "ipamgc-worker-7d9-x"}) == "ipamgc-worker-7d9-x"
    assert instance_name({"IPAMGC_INSTANCE": "mine", "POD_NAME": "pod"}) == "mine"
    assert instance_name({}) == socket.gethostname()


def test_the_metrics_port_is_the_flag_else_the_environment_else_calicos() -> None:
    assert resolve_metrics_port(9100, {"IPAMGC_METRICS_PORT": "0"}) == 9100
    assert resolve_metrics_port(None, {"IPAMGC_METRICS_PORT": "0"}) == 0  # disabled
    assert resolve_metrics_port(None, {}) == 9094
    with pytest.raises(click.UsageError):
        resolve_metrics_port(None, {"IPAMGC_METRICS_PORT": "70000"})
