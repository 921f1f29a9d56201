"""No pickle anywhere, and a job forged in Redis runs no code.

`tests/redisio/shardqueue/test_rq.py` proves a job enqueued by the workers' side is msgpack and that a
forged pickle payload is refused by an in-process worker.  Here: the source tree holds no pickle at all;
the watcher's own enqueuer writes msgpack too; and forged jobs that are perfectly valid msgpack — naming
`os.system`, carrying an instance, or callbacks — are refused by a real `ipamgc work` process, which then
goes on with the next (genuine) job.
"""

from __future__ import annotations

import ast
import base64
import io
import os
import subprocess
import sys
import tokenize
import zlib
from pathlib import Path

import msgpack
import pytest
import redis
import rq

from redisio.shardqueue.jobs import (
    SHARD_JOB,
    MsgpackSerializer,
    ShardEnqueuer,
    ShardJob,
    enqueue_shard,
    shard_queue,
)
from shared.keys import Keys
from tests.fixtures.stack import ROOT

PACKAGES = ("shared", "producer", "workers", "ipamgc")
UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "shelve", "marshal", "jsonpickle"}


def _sources() -> list[Path]:
    return [path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))]


def test_no_pickle_in_the_source_tree() -> None:
    """No module of the packages imports a deserializer that can run code, and no code (docstrings and
    comments aside) even names pickle."""
    found: list[str] = []
    for path in _sources():
        source = path.read_text()
        for node in ast.walk(ast.parse(source, str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module.split(".")[0]]
            found += [
                f"{path.relative_to(ROOT)}:{node.lineno} imports {n}" for n in names if n in UNSAFE_MODULES
            ]
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.NAME and "pickle" in tok.string.lower():
                found.append(f"{path.relative_to(ROOT)}:{tok.start[0]} {tok.string}")
    assert found == []


def test_every_rq_entry_point_names_the_msgpack_serializer() -> None:
    """Every RQ Queue/Worker built in the packages passes `serializer=` (RQ's default is pickle)."""
    missing: list[str] = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            func = node.func
            if not (isinstance(func.value, ast.Name) and func.value.id == "rq"):
                continue
            if func.attr in ("Queue", "SimpleWorker", "Worker") and not any(
                k.arg == "serializer" for k in node.keywords
            ):
                missing.append(f"{path.relative_to(ROOT)}:{node.lineno} rq.{func.attr}")
    assert missing == []


def test_the_watchers_enqueuer_writes_msgpack(client: redis.Redis, keys: Keys) -> None:
    ShardEnqueuer(client, keys)(5)
    [job_id] = shard_queue(client, keys, 5).job_ids
    data = client.hget(f"rq:job:{job_id}", "data")
    assert data is not None
    assert msgpack.unpackb(zlib.decompress(data)) == [SHARD_JOB, None, [5], {"prefix": keys.prefix}]
    with pytest.raises(Exception):  # noqa: B017 - any error: it must not be a pickle
        __import__("pickle").loads(zlib.decompress(data))


FORGED = {
    "os.system": ["os.system", None, ["touch {marker}"], {}],
    "builtins.exec": ["builtins.exec", None, ["open({marker!r}, 'w')"], {}],
    "shard job, forged kwargs": [SHARD_JOB, None, [1], {"prefix": "ipamgc", "client": "x"}],
    "instance method": ["format", "{marker}", [], {}],
}


def _run_burst(url: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "ipamgc.commands.work",
            "--redis-url",
            url,
            "--burst",
            "--log-level",
            "WARNING",
        ],
        check=False,
        cwd=ROOT,
        capture_output=True,
        timeout=60,
        env={**os.environ, "IPAMGC_METRICS_PORT": "0"},
    )


def test_forged_msgpack_jobs_run_no_code_in_a_real_worker(
    client: redis.Redis, keys: Keys, redis_url: str, tmp_path: Path
) -> None:
    """msgpack carries no objects, but RQ calls the function a payload names: `ShardJob` refuses any but
    the shard job before importing it, and drops callbacks."""
    marker = tmp_path / "pwned"
    forged_ids = []
    for shape in FORGED.values():
        job = enqueue_shard(shard_queue(client, keys, 1), 1)
        payload = [str(v).format(marker=str(marker)) if isinstance(v, str) else v for v in shape]
        payload[2] = [a.format(marker=str(marker)) if isinstance(a, str) else a for a in payload[2]]
        client.hset(job.key, "data", zlib.compress(msgpack.packb(payload)))
        forged_ids.append(job.id)
    callback = enqueue_shard(shard_queue(client, keys, 2), 2)
    client.hset(
        callback.key, mapping={"success_callback_name": "os.system", "failure_callback_name": "os.system"}
    )
    genuine = enqueue_shard(shard_queue(client, keys, 3), 3)
    done = _run_burst(redis_url)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert not marker.exists()
    for job_id in forged_ids:
        job = ShardJob.fetch(job_id, connection=client, serializer=MsgpackSerializer)
        assert job.get_status() == rq.job.JobStatus.FAILED
    # The callback names were dropped; the genuine jobs ran (gated: the mirror is empty, which is fine)
    # and finished: with result_ttl=0 RQ deletes a finished job at once (a failed one is kept, above).
    for job in (callback, genuine):
        assert not client.exists(job.key)
        assert job.id not in shard_queue(client, keys, job.args[0]).failed_job_registry.get_job_ids()


def test_every_rq_payload_left_in_redis_is_msgpack(client: redis.Redis, keys: Keys, redis_url: str) -> None:
    """Job payloads and results (what a worker writes back), before and after a real worker ran: all
    msgpack.  Shard jobs store no result (result_ttl=0) and a finished job is deleted, so the payloads
    are checked while queued too; anything left after the run must still be msgpack."""
    for shard in range(3):
        enqueue_shard(shard_queue(client, keys, shard), shard)
    checked = _check_payloads(client)
    assert checked >= 3
    assert _run_burst(redis_url).returncode == 0
    _check_payloads(client)


def _check_payloads(client: redis.Redis) -> int:
    checked = 0
    for key in client.scan_iter("rq:job:*"):
        if client.type(key) != b"hash":
            continue
        data = client.hget(key, "data")
        if data:
            msgpack.unpackb(zlib.decompress(data), strict_map_key=False)
            checked += 1
    for key in client.scan_iter("rq:results:*"):
        for _id, fields in client.xrange(key):
            value = fields.get(b"return_value")
            if value:
                MsgpackSerializer.loads(base64.b64decode(value))  # RQ stores results base64-encoded
                checked += 1
    return checked
