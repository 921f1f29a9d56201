"""Redis least privilege: each component runs under its own ACL user (shared/acl.py) and is refused
outside it.

The watcher, a worker and the leader run as real processes, each with its own user's URL, against a
redis-server that loads the generated ACL file; they release a deleted node's leak and a live node's
(after a 2 s grace period), the watcher's /metrics is scraped, and `status`, `audit` and `health` run
under the read-only user and the components' users.  Redis's ACL log must stay empty: not one command
of theirs (nor of RQ's, nor of a Lua script's) was refused.  Then each user tries what it must not do.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from ipamgc.supervisor import Supervisor, python_module
from lab.apiserver.apiserver import SimApiServer
from lab.apiserver.resources import KUBEVIRT_RESOURCES, RESOURCES
from lab.apiserver.store import Store
from lab.chaos import COMPONENT_ENV, free_port
from lab.cluster.cluster import SimCluster
from lab.cluster.kubevirt import KubeVirt
from shared.acl import COMPONENTS, Credential, acl_file, credential_from_url, rules, users
from shared.keys import STATE_KUBEVIRT, Keys
from tests.acl_redis import CREDENTIALS, PASSWORDS, AclRedis, acl_redis
from tests.deploy.test_runbooks import runbook_commands
from tests.fixtures.stack import ROOT
from tests.polling import wait_until

KEYS = Keys()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[AclRedis]:
    with acl_redis(tmp_path, acl_file(KEYS, CREDENTIALS)) as s:
        yield s


def _url(server: AclRedis, component: str) -> str:
    return server.url(component, PASSWORDS[component])


@contextlib.contextmanager
def _stack(server: AclRedis, kubeconfig: Path, log_dir: Path, metrics_port: int) -> Iterator[Supervisor]:
    sup = Supervisor(log_dir)
    sup.env.update(COMPONENT_ENV)
    kube = ["--kubeconfig", str(kubeconfig)]
    try:
        watch = ["--redis-url", _url(server, "watcher"), *kube, "--metrics-port", str(metrics_port)]
        sup.add("watcher", python_module("ipamgc.commands.watch", *watch))
        sup.add("worker", python_module("ipamgc.commands.work", "--redis-url", _url(server, "worker")))
        lead = ["--redis-url", _url(server, "leader"), *kube, "--identity", "leader-acl"]
        sup.add("leader", python_module("ipamgc.commands.lead", *lead))
        yield sup
    finally:
        sup.stop()


def _cli(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", *args],
        check=False,
        cwd=ROOT,
        capture_output=True,
        timeout=60,
        env={**os.environ, **COMPONENT_ENV},
    )


def test_each_component_runs_under_its_acl_user(server: AclRedis, tmp_path: Path) -> None:
    store = Store(RESOURCES + KUBEVIRT_RESOURCES, seed=5)  # with KubeVirt: its mirror and VM rule too
    sim = SimCluster(store, seed=5)
    sim.bootstrap("2s")
    for node in ("node-a", "node-b", "node-dead"):
        sim.add_node(node)
    kv = KubeVirt(sim)
    kv.create_vm("vms", "vm-dead", "node-dead")
    kv.create_vm("vms", "vm-kept", "node-b")
    sim.create_pod("ns", "on-dead", "node-dead")
    sim.create_pod("ns", "orphan", "node-a")
    sim.create_pod("ns", "kept", "node-b")
    logs = tmp_path / "logs"
    logs.mkdir()
    port = free_port()
    with SimApiServer(store, bookmark_interval=0.2) as api:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        with _stack(server, kubeconfig, logs, port) as sup:
            wait_until(lambda: server.admin.hget(KEYS.state, "synced") == b"1", timeout=20)
            wait_until(lambda: server.admin.hget(KEYS.state, STATE_KUBEVIRT) == b"1", timeout=20)
            sim.leak_node_deleted("node-dead")
            kv.leak_vm_deleted_without_cni_del("vms", "vm-dead")
            sim.leak_pod_deleted_without_cni_del("ns", "orphan")
            assert len(sim.truth.leaked_ips()) >= 4  # the dead node's pod, VM and tunnel IPs, the orphan's

            def released() -> bool:
                sup.poll()
                return not sim.truth.leaked_ips()

            wait_until(released, timeout=40, interval=0.1, what="every leak released under the ACL")
            assert sim.truth.violations == []
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
                assert b"ipam_allocations_in_use" in reply.read()
            for probe in ("liveness", "readiness"):
                for component in ("watcher", "worker", "leader"):
                    done = _cli(
                        "ipamgc.commands.health",
                        "--component",
                        component,
                        "--probe",
                        probe,
                        "--redis-url",
                        _url(server, component),
                    )
                    assert done.returncode == 0, done.stdout + done.stderr
            reader = _url(server, "reader")
            for command in (["status"], ["status", "-o", "json"], ["audit"], ["audit", "-o", "json"]):
                done = _cli("ipamgc", *command, "--redis-url", reader)
                assert done.returncode == 0, done.stderr
            _follow_the_runbooks(reader, kubeconfig, tmp_path)
            # the kubelet's probes of the watcher, over HTTP
            for path in ("/livez", "/readyz"):
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as reply:
                    assert reply.status == 200
            assert b"released" in _cli("ipamgc", "audit", "--redis-url", reader).stdout
            exits = {c["name"]: c["exits"] for c in sup.status()}
            assert exits == {"watcher": [], "worker": [], "leader": []}
    assert server.refusals() == []


def _follow_the_runbooks(reader: str, kubeconfig: Path, tmp_path: Path) -> None:
    """Every `ipamgc` command of docs/runbooks.md, as an operator runs it: the Redis ones as the reader,
    the cluster ones with this cluster's kubeconfig for `~/.kube/config`, `release` as a dry run only."""
    report = tmp_path / "report.json"
    ran = set()
    for argv in runbook_commands():
        args = [str(kubeconfig) if a == "~/.kube/config" else a for a in argv]
        if args[0] in ("status", "audit", "health"):
            args += ["--redis-url", reader]
        elif args[0] == "check" and "--output" in args:
            args += ["--output-file", str(report)]
        elif args[0] == "release":
            if "--dry-run" not in args:
                continue  # what the runbook's next line does for real; the leader has released all already
            args = [str(report) if a == "report.json" else a for a in args] + ["--redis-url", reader]
        done = _cli("ipamgc", *args)
        assert done.returncode == 0, (argv, done.stdout[-500:], done.stderr[-500:])
        ran.add(args[0])
    assert ran == {"status", "audit", "health", "check", "release"}


# (user, command) pairs each user must be refused: another component's keys, writes a reader must not
# make, and the server's administration.
REFUSED: list[tuple[str, tuple[str, ...]]] = [
    ("watcher", ("XADD", KEYS.decisions, "*", "id", "forged")),  # forge a release decision
    ("watcher", ("XADD", KEYS.audit, "*", "r", "x")),
    ("watcher", ("HSET", KEYS.leader("ipamgc-leader"), "token", "x")),
    ("watcher", ("HINCRBY", KEYS.metrics, "validated", "1")),  # read only: the workers' counters
    ("watcher", ("FLUSHALL",)),
    ("worker", ("HSET", KEYS.blocks, "10.0.0.0/26", "x")),  # rewrite the mirror
    ("worker", ("HDEL", KEYS.pods, "ns/p")),
    ("worker", ("SADD", KEYS.dirtyblocks(0), "10.0.0.0/26")),
    ("worker", ("XREADGROUP", "GROUP", "leader", "w", "STREAMS", KEYS.decisions, ">")),
    ("worker", ("HSET", KEYS.leader("ipamgc-leader"), "token", "x")),
    ("worker", ("SET", KEYS.health("leader", "x"), "{}")),  # another component's heartbeat
    ("worker", ("CONFIG", "SET", "maxmemory", "1")),
    ("leader", ("HSET", KEYS.blocks, "10.0.0.0/26", "x")),
    ("leader", ("SADD", KEYS.dirty(0), "h/10.0.0.1")),
    ("leader", ("LPUSH", "rq:queue:ipamgc-shard-0", "x")),  # enqueue
    ("leader", ("XADD", "other:stream", "*", "a", "b")),
    ("leader", ("KEYS", "*")),
    ("reader", ("HSET", KEYS.state, "synced", "0")),
    ("reader", ("DEL", KEYS.audit)),
    ("reader", ("XADD", KEYS.audit, "*", "r", "x")),
    ("reader", ("EVAL", "return 1", "0")),
    ("reader", ("GET", "secret:elsewhere")),
    ("reader", ("FLUSHDB",)),
    ("default", ("GET", KEYS.state)),  # no password: PING only
    ("default", ("HGETALL", KEYS.state)),
]


@pytest.mark.parametrize(("user", "command"), REFUSED, ids=[f"{u}-{c[0]}" for u, c in REFUSED])
def test_each_user_is_refused_outside_its_grants(
    server: AclRedis, user: str, command: tuple[str, ...]
) -> None:
    c = server.client() if user == "default" else server.client(user, PASSWORDS[user])
    try:
        with pytest.raises(redis.exceptions.NoPermissionError):
            c.execute_command(*command)
        assert c.ping()  # refused, not disconnected: the same connection still works
    finally:
        c.close()
    [entry] = server.refusals()
    assert entry["username"] == user


def test_a_script_is_refused_the_keys_its_caller_may_not_touch(server: AclRedis) -> None:
    """Redis checks a script's commands against the caller: the worker cannot reach the mirror by Lua."""
    worker = server.client("worker", PASSWORDS["worker"])
    try:
        sha = worker.script_load("return redis.call('HSET', KEYS[1], 'b', 'x')")
        with pytest.raises(redis.exceptions.NoPermissionError):  # a declared key
            worker.evalsha(sha, 1, KEYS.blocks)
        undeclared = worker.script_load(f"return redis.call('HSET', '{KEYS.blocks}', 'b', 'x')")
        # Redis: "... can't access at least one of the keys ..."; Valkey: "No permissions to access a key".
        with pytest.raises(redis.exceptions.ResponseError, match=r"access (at least one of the keys|a key)"):
            worker.evalsha(undeclared, 0)
        # Its own key through the same script: granted (the script path itself works).
        assert worker.evalsha(sha, 1, KEYS.cand(0)) == 1
    finally:
        worker.close()
    refused = {(e["username"], e["context"], e["reason"], e["object"]) for e in server.refusals()}
    assert refused == {("worker", "toplevel", "key", KEYS.blocks), ("worker", "lua", "key", KEYS.blocks)}
    assert server.admin.hlen(KEYS.blocks) == 0


def test_each_user_is_granted_what_it_does(server: AclRedis) -> None:
    """The positive side of the refusals above, one command each, so the table cannot pass by refusing
    everything."""
    cases = {
        "watcher": ("HSET", KEYS.blocks, "10.0.0.0/26", "x"),
        "worker": ("XADD", KEYS.decisions, "*", "id", "x"),
        "leader": ("XADD", KEYS.audit, "*", "r", "x"),
        "reader": ("HGETALL", KEYS.state),
    }
    for user, command in cases.items():
        c = server.client(user, PASSWORDS[user])
        try:
            c.execute_command(*command)
        finally:
            c.close()
    assert server.client().ping()  # the default user's PING (the probes' `redis-cli ping`)
    # the runbooks' `redis-cli -u <reader URL> info memory` (docs/runbooks.md, "Before you start")
    reader = server.client("reader", PASSWORDS["reader"])
    try:
        assert "used_memory" in reader.info("memory")
    finally:
        reader.close()
    assert server.refusals() == []


def test_a_shard_job_may_shorten_its_queued_flag(server: AclRedis) -> None:
    """Every shard job starts with PEXPIRE on its shard's `queued` flag (workers/validate.py): refused, the
    worker user could run no real shard job."""
    c = server.client("worker", PASSWORDS["worker"])
    try:
        c.set(KEYS.queued(0), "1")
        assert c.pexpire(KEYS.queued(0), 30_000)
    finally:
        c.close()
    assert server.refusals() == []


def test_the_patterns_follow_the_prefix() -> None:
    other = Keys("tenant-b")
    for user in users(other):
        for grant in user.keys:
            assert grant.pattern.startswith(("tenant-b:", "rq:")), grant
    [_, watcher, *_] = rules(other, CREDENTIALS)
    assert "~tenant-b:alloc:{*}" in watcher[1].split()


def test_credentials_come_from_the_components_urls() -> None:
    assert credential_from_url("worker", "redis://worker:p%40ss@redis:6379/0") == Credential("worker", "p@ss")
    assert credential_from_url("leader", "rediss://:pw@redis:6379/0") == Credential("leader", "pw")
    with pytest.raises(ValueError, match="no password"):
        credential_from_url("watcher", "redis://watcher@redis:6379/0")
    creds = dict(CREDENTIALS)
    creds["reader"] = Credential("worker", "x")
    with pytest.raises(ValueError, match="distinct"):
        rules(KEYS, creds)
    with pytest.raises(ValueError, match="no credentials"):
        rules(KEYS, {c: CREDENTIALS[c] for c in COMPONENTS[:3]})
