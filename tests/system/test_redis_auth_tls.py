"""Redis authentication and TLS through the URL, and no secret in any log.

Every component (watcher, worker, leader: real processes, DEBUG logging) runs against a redis-server that
requires a password — `redis://:<password>@…` — and, where the installed server speaks TLS, one that
listens on TLS only — `rediss://:<password>@…?ssl_cert_reqs=required&ssl_ca_certs=<ca>` with a
self-signed certificate made by `openssl` — and their kubeconfig carries a bearer token.  They do their
work (a leak on a deleted node is released), and neither the password nor the token appears in any log,
not even when a component is given a wrong password.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import redis

from ipamgc.supervisor import Supervisor, python_module
from lab.apiserver.apiserver import SimApiServer
from lab.apiserver.store import Store
from lab.chaos import COMPONENT_ENV, RedisProcess, Tls
from lab.cluster.cluster import SimCluster
from tests.certs import self_signed
from tests.fixtures.stack import ROOT
from tests.polling import wait_until

PASSWORD = "pw-5ecret-redis-7Hq2"
TOKEN = "tok-5ecret-bearer-Zx81"


def _kubeconfig(server: SimApiServer, path: Path) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "sim", "cluster": {"server": server.url}}],
        "users": [{"name": "sim", "user": {"token": TOKEN}}],
        "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "sim"}}],
        "current-context": "sim",
    }
    path.write_bytes(orjson.dumps(config))
    return path


@contextlib.contextmanager
def _components(url: str, kubeconfig: Path, log_dir: Path) -> Iterator[Supervisor]:
    sup = Supervisor(log_dir)
    sup.env.update(COMPONENT_ENV)
    common = ["--redis-url", url, "--log-level", "DEBUG"]
    kube = ["--kubeconfig", str(kubeconfig)]
    try:
        sup.add("watcher", python_module("ipamgc.commands.watch", *common, *kube))
        sup.add("worker", python_module("ipamgc.commands.work", *common))
        sup.add("leader", python_module("ipamgc.commands.lead", *common, *kube, "--identity", "leader-sec"))
        yield sup
    finally:
        sup.stop()


def _run_stack(redis_proc: RedisProcess, tmp_path: Path) -> Path:
    """The three components against `redis_proc`; returns their log directory once a leak is released."""
    store = Store(seed=3)
    sim = SimCluster(store, seed=3)
    sim.bootstrap("1h")
    sim.add_node("node-a")
    sim.add_node("node-dead")
    sim.create_pod("ns", "p", "node-dead")
    logs = tmp_path / "logs"
    logs.mkdir()
    with SimApiServer(store, bookmark_interval=0.2) as server:
        kubeconfig = _kubeconfig(server, tmp_path / "kubeconfig")
        with _components(redis_proc.url, kubeconfig, logs) as sup:
            sim.leak_node_deleted("node-dead")
            assert sim.truth.leaked_ips()

            def released() -> bool:
                sup.poll()
                return not sim.truth.leaked_ips()

            wait_until(released, timeout=40, interval=0.1)
            assert sim.truth.violations == []
            assert {c["name"]: c["exits"] for c in sup.status()} == {
                "watcher": [],
                "worker": [],
                "leader": [],
            }
            agents = {r.user_agent for r in server.requests}
            assert any(a.startswith("ipamgc-leader/") for a in agents)  # the leader did the release
    return logs


def _assert_no_secrets(*texts: str) -> None:
    for text in texts:
        assert PASSWORD not in text
        assert TOKEN not in text


def _logs(directory: Path) -> list[str]:
    texts = [p.read_text(errors="replace") for p in sorted(directory.glob("*.log"))]
    assert texts and all(texts)  # DEBUG logs were written
    return texts


def test_every_component_authenticates_with_a_password_in_the_url(tmp_path: Path) -> None:
    redis_proc = RedisProcess(tmp_path / "redis.log", password=PASSWORD)
    redis_proc.start()
    try:
        assert PASSWORD in redis_proc.url
        _assert_no_secrets(*_logs(_run_stack(redis_proc, tmp_path)))
        # A wrong password: the component fails, and says so without echoing either password.
        wrong = redis_proc.url.replace(PASSWORD, PASSWORD[::-1])
        done = subprocess.run(
            [sys.executable, "-m", "ipamgc.commands.work", "--redis-url", wrong, "--burst"],
            check=False,
            cwd=ROOT,
            capture_output=True,
            timeout=60,
            env={**os.environ, **COMPONENT_ENV},
        )
        output = (done.stdout + done.stderr).decode(errors="replace")
        assert done.returncode != 0 and ("auth" in output.lower() or "password" in output.lower())
        assert PASSWORD[::-1] not in output
        _assert_no_secrets(output)
    finally:
        redis_proc.stop()


def _self_signed(directory: Path) -> Tls | None:
    pair = self_signed(directory)
    return Tls(pair[0], pair[1], pair[0]) if pair is not None else None


def test_every_component_speaks_tls_with_rediss_urls(tmp_path: Path) -> None:
    tls = _self_signed(tmp_path)
    if tls is None:
        pytest.skip("no openssl to make a certificate: TLS is not tested here (see docs/chaos.md)")
    redis_proc = RedisProcess(tmp_path / "redis.log", password=PASSWORD, tls=tls)
    try:
        redis_proc.start()
    except RuntimeError:
        pytest.skip("this redis-server has no TLS support (--tls-port): see docs/chaos.md")
    try:
        assert redis_proc.url.startswith("rediss://")
        _assert_no_secrets(*_logs(_run_stack(redis_proc, tmp_path)))
        plain = redis.Redis(host="127.0.0.1", port=redis_proc.port, password=PASSWORD, socket_timeout=2)
        with pytest.raises(redis.ConnectionError):  # the port speaks TLS only: nothing went in clear
            plain.ping()
        plain.close()
    finally:
        redis_proc.stop()
