"""`status` and `audit` against a Redis that fails (a timeout included), an empty one, and no or several
running `up`s; `check`'s grace read as the collector reads it; the cluster identity of audit records."""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner

from ipamgc import commands
from ipamgc.checklive import grace_of
from ipamgc.commands.audit import audit
from ipamgc.commands.status import status
from ipamgc.local_redis import NoRedisTarget, resolve
from shared.cluster import ClusterIdentity, from_mapping, same_cluster
from shared.keys import Keys
from tests.fixtures.redis import Endpoint
from workers.leader.audit import AuditRecord, Result, decode_entry, read_audit


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A loopback TCP server that accepts and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(sock.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield f"redis://127.0.0.1:{sock.getsockname()[1]}/0"
    stop.set()
    t.join(timeout=5)
    for c in held:
        c.close()
    sock.close()


@pytest.mark.parametrize("command", [status, audit], ids=["status", "audit"])
def test_a_redis_that_never_answers_is_one_line_and_exit_2(
    command: object, silent_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(commands, "REDIS_TIMEOUT_SECONDS", 0.5)
    result = CliRunner().invoke(command, ["--redis-url", silent_server])  # type: ignore[arg-type]
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 2 and "Timeout" in lines[1] and "Traceback" not in result.output


@pytest.mark.parametrize("command", [status, audit], ids=["status", "audit"])
def test_an_empty_redis_says_so_and_exits_1(
    command: object, redis_endpoint: Endpoint, client: redis.Redis
) -> None:
    url = f"redis://{redis_endpoint.host}:{redis_endpoint.port}/0"
    result = CliRunner().invoke(command, ["--redis-url", url])  # type: ignore[arg-type]
    assert result.exit_code == 1
    assert "no ipamgc data in this Redis" in result.stderr.splitlines()[-1]


def _announce(directory: Path, pid: int, url: str) -> None:
    (directory / f"up-{pid}.json").write_text(json.dumps({"redis_url": url, "pid": pid, "started": 1.0}))


def test_a_running_up_is_used_only_when_it_is_the_only_one(tmp_path: Path) -> None:
    env = {"IPAMGC_RUNTIME_DIR": str(tmp_path)}
    with pytest.raises(NoRedisTarget, match="no `ipamgc up` is running: give --redis-url"):
        resolve(None, env)
    _announce(tmp_path, os.getpid(), "redis://127.0.0.1:1111/0")
    target = resolve(None, env)
    assert target.url == "redis://127.0.0.1:1111/0" and "the only running `ipamgc up`" in target.source
    _announce(tmp_path, os.getppid(), "redis://127.0.0.1:2222/0")
    with pytest.raises(NoRedisTarget, match="2 `ipamgc up` are running"):
        resolve(None, env)
    assert resolve("redis://x:1/0", env).source == "--redis-url"


def _kcc(name: str, grace: object) -> dict[str, object]:
    node = {} if grace is None else {"leakGracePeriod": grace}
    return {"metadata": {"name": name}, "spec": {"controllers": {"node": node}}}


def test_check_reads_the_grace_as_the_collector_does() -> None:
    assert grace_of([_kcc("other", "1s"), _kcc("default", "5s")])[0] == 5.0
    assert grace_of([_kcc("default", None)])[0] is None  # unset: nothing collected on live nodes
    assert grace_of([_kcc("default", 12)])[0] is None  # malformed: read as unset, as the watcher does
    assert grace_of([])[0] == 900.0  # no default: Calico's 15m


def test_audit_records_carry_their_cluster_and_older_ones_stay_readable(
    client: redis.Redis, keys: Keys
) -> None:
    ident = ClusterIdentity("https://a:6443", "uid-a")
    new = AuditRecord(Result.RELEASED, ip="10.0.0.1", at=1.0).stamped(ident)
    old_fields = AuditRecord(Result.RELEASED, ip="10.0.0.2", at=2.0).to_fields()[:-4]  # no cluster fields
    for flat in (new.to_fields(), old_fields):
        client.xadd(keys.audit, dict(zip(flat[::2], flat[1::2], strict=True)))
    everything, bad = read_audit(client, keys)
    assert bad == 0 and [r.ip for r in everything] == ["10.0.0.1", "10.0.0.2"]
    assert everything[0].identity == ident and everything[1].identity is None
    only_a, _ = read_audit(client, keys, 10, lambda r: r.identity is not None and r.identity.matches("uid-a"))
    assert [r.ip for r in only_a] == ["10.0.0.1"]
    raw = client.xrange(keys.audit)[1]
    assert decode_entry(raw[0], raw[1]).cluster == ""


def test_same_cluster_is_the_uid_when_both_have_one() -> None:
    a = ClusterIdentity("https://10.96.0.1:443", "u1")
    assert same_cluster(a, ClusterIdentity("https://api.example:6443", "u1"))
    assert not same_cluster(a, ClusterIdentity("https://10.96.0.1:443", "u2"))
    assert same_cluster(ClusterIdentity("https://a/"), ClusterIdentity("https://a", "u"))
    assert from_mapping({}) is None
    assert from_mapping({b"server": b"https://a", b"kube_system_uid": b"u"}) == ClusterIdentity(
        "https://a", "u"
    )
