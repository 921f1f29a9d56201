"""Compose's rq-dashboard, for real: `python -m ipamgc.dashboard` (rq-dashboard 0.9.0, the pinned
`dashboard` extra) against a redis-server with the ACL of shared/acl.py, logged in as the read-only
`reader`, holding ipamgc's own jobs — shard jobs the watcher's enqueuer wrote, a forged job a real
`ipamgc work --burst` refused into the failed registry, a live worker.  Its pages are read over HTTP:
every one answers 200 with the jobs in it; every write it offers is refused, and Redis is unchanged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import yaml

from lab.chaos import COMPONENT_ENV, free_port
from redisio.shardqueue.jobs import ShardEnqueuer
from shared.acl import acl_file
from shared.keys import Keys
from tests.acl_redis import CREDENTIALS, PASSWORDS, AclRedis, acl_redis
from tests.deploy.conftest import COMPOSE, ROOT
from tests.polling import wait_until

KEYS = Keys()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[AclRedis]:
    with acl_redis(tmp_path, acl_file(KEYS, CREDENTIALS)) as s:
        yield s


def _get(base: str, path: str, method: str = "GET") -> tuple[int, bytes]:
    request = urllib.request.Request(base + path, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return int(reply.status), bytes(reply.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), bytes(exc.read())
    except OSError:
        return 0, b""


def _module(name: str, *args: str) -> list[str]:
    return [sys.executable, "-m", name, *args]


def _json(base: str, path: str) -> Any:
    status, body = _get(base, path)
    assert status == 200, (path, status, body[:300])
    return json.loads(body)


def _snapshot(server: AclRedis) -> dict[bytes, Any]:
    """Every RQ key with its contents (as the admin user), to prove nothing was written."""
    out: dict[bytes, Any] = {}
    for key in sorted(server.admin.scan_iter("rq:*")):
        kind = server.admin.type(key)
        if kind == b"hash":
            out[key] = server.admin.hgetall(key)
        elif kind == b"list":
            out[key] = server.admin.lrange(key, 0, -1)
        elif kind == b"zset":
            out[key] = server.admin.zrange(key, 0, -1)
        elif kind == b"set":
            out[key] = server.admin.smembers(key)
    return out


def _failed_job(server: AclRedis) -> str:
    """A forged job (it names os.system) that a real worker, under its own user, refuses and fails."""
    enqueue = ShardEnqueuer(server.client("watcher", PASSWORDS["watcher"]), KEYS)
    enqueue(2)
    [job_id] = [k.decode().removeprefix("rq:job:") for k in server.admin.scan_iter("rq:job:*")]
    forged = zlib.compress(msgpack.packb(["os.system", None, ["true"], {}]))
    server.admin.hset(f"rq:job:{job_id}", "data", forged)
    url = server.url("worker", PASSWORDS["worker"])
    done = subprocess.run(
        [sys.executable, "-m", "ipamgc.commands.work", "--redis-url", url, "--burst", "--shards", "2"],
        check=False,
        cwd=ROOT,
        capture_output=True,
        timeout=60,
        env={**os.environ, **COMPONENT_ENV},
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert server.admin.zscore(f"rq:failed:{KEYS.queue_name(2)}", job_id) is not None
    return job_id


def test_rq_dashboard_shows_ipamgc_jobs_and_writes_nothing(server: AclRedis, tmp_path: Path) -> None:
    failed = _failed_job(server)
    ShardEnqueuer(server.client("watcher", PASSWORDS["watcher"]), KEYS)(0)
    ShardEnqueuer(server.client("watcher", PASSWORDS["watcher"]), KEYS)(1)
    queued = {k.decode().removeprefix("rq:job:") for k in server.admin.scan_iter("rq:job:*")} - {failed}
    assert len(queued) == 2

    worker_log = (tmp_path / "worker.log").open("wb")
    # A live worker on shard 3 only: the queued jobs of shards 0 and 1 stay where the dashboard shows them.
    worker = subprocess.Popen(
        [
            *_module("ipamgc.commands.work", "--shards", "3"),
            "--redis-url",
            server.url("worker", PASSWORDS["worker"]),
        ],
        cwd=ROOT,
        stdout=worker_log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **COMPONENT_ENV},
    )
    port = free_port()
    dashboard_log = (tmp_path / "dashboard.log").open("wb")
    dashboard = subprocess.Popen(
        [
            *_module("ipamgc.dashboard", "--port", str(port)),
            "--redis-url",
            server.url("reader", PASSWORDS["reader"]),
        ],
        cwd=ROOT,
        stdout=dashboard_log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _get(base, "/")[0] == 200, timeout=20, interval=0.1, what="the dashboard up")
        workers = wait_until(
            lambda: _json(base, "/0/data/workers.json")["workers"], timeout=20, what="the worker listed"
        )
        assert [w["queues"] for w in workers] == [[KEYS.queue_name(3)]]
        before = _snapshot(server)

        queues = {q["name"]: q for q in _json(base, "/0/data/queues.json")["queues"]}
        assert queues[KEYS.queue_name(0)]["count"] == 1 and queues[KEYS.queue_name(1)]["count"] == 1
        assert queues[KEYS.queue_name(2)]["failed_job_registry_count"] == 1
        listed = _json(base, f"/0/data/jobs/{KEYS.queue_name(0)}/queued/8/asc/1.json")["jobs"]
        assert [j["description"] for j in listed] == ["validate shard 0"]
        [fjob] = _json(base, f"/0/data/jobs/{KEYS.queue_name(2)}/failed/8/asc/1.json")["jobs"]
        assert fjob["id"] == failed and "not a shard job" in fjob["exc_info"]
        for job_id in queued:
            info = _json(base, f"/0/data/job/{job_id}.json")
            assert info["status"] == "queued" and info["description"].startswith("validate shard ")
            status, page = _get(base, f"/0/view/job/{job_id}")
            assert status == 200 and b"RQ dashboard" in page
        assert _json(base, f"/0/data/job/{failed}.json")["status"] == "failed"
        for page in ("/", "/0/view/workers", f"/0/view/jobs/{KEYS.queue_name(2)}/failed/8/asc/1"):
            assert _get(base, page)[0] == 200, page

        some = next(iter(queued))
        writes = [
            (f"/job/{some}/delete", "POST"),
            (f"/job/{failed}/requeue", "POST"),
            (f"/requeue/{KEYS.queue_name(2)}", "GET"),  # a GET that requeues in rq-dashboard
            (f"/queue/{KEYS.queue_name(0)}/queued/empty", "POST"),
            (f"/queue/{KEYS.queue_name(0)}/compact", "POST"),
        ]
        for path, method in writes:
            assert _get(base, path, method)[0] == 403, path
        assert _snapshot(server) == before
    finally:
        dashboard.terminate()
        worker.terminate()
        for proc in (dashboard, worker):
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        dashboard_log.close()
        worker_log.close()
    assert server.refusals() == []  # the reader's grants cover every page; the worker's its run


def test_the_dashboard_behind_the_read_only_user_is_refused_by_redis_too(server: AclRedis) -> None:
    """The second layer: were the 403 hook bypassed, rq-dashboard's own requeue, run as `reader`, is
    refused by Redis."""
    import redis
    import rq

    from redisio.shardqueue.jobs import MsgpackSerializer

    failed = _failed_job(server)
    reader = server.client("reader", PASSWORDS["reader"])
    try:
        with pytest.raises(redis.exceptions.NoPermissionError):
            rq.job.Job.fetch(failed, connection=reader, serializer=MsgpackSerializer).requeue()
    finally:
        reader.close()
    assert server.admin.zscore(f"rq:failed:{KEYS.queue_name(2)}", failed) is not None


def test_compose_runs_this_dashboard_pinned_and_local_only() -> None:
    compose = yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())
    s = compose["services"]["rq-dashboard"]
    assert s["entrypoint"] == ["python", "-m", "ipamgc.dashboard"]
    assert s["build"]["args"]["EXTRAS"] == "[dashboard]"
    assert s["environment"]["REDIS_URL"].startswith("redis://reader:")
    assert s["read_only"] is True
    for name in ("rq-dashboard", "prometheus"):
        for port in compose["services"][name]["ports"]:
            assert port.startswith("${IPAMGC_PUBLISH_ADDR:-127.0.0.1}:"), (name, port)
    import tomllib

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "rq-dashboard==0.9.0" in extra["dashboard"]
    assert any(p.startswith("six==") for p in extra["dashboard"])
    import rq_dashboard.version

    assert rq_dashboard.version.VERSION == "0.9.0"  # what this module's test ran against
