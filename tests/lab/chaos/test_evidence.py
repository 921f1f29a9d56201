"""A failed chaos run keeps what its Redis knew of each leak still outstanding (`evidence.json`), since
the run's Redis goes with the run: the audit records, the decisions and the worker's marks."""

from __future__ import annotations

from pathlib import Path

import orjson
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from lab.chaos.evidence import keep_evidence
from shared.keys import Keys
from shared.shard import DEFAULT_SHARDS
from tests.fixtures.leader import Env, decided_leak


def test_the_evidence_of_an_outstanding_leak_names_its_marks_decisions_and_audit(
    env: Env, tmp_path: Path
) -> None:
    ip, alloc_id, shard = decided_leak(env)
    other = "10.255.0.9"  # outstanding with nothing in Redis: written, empty
    path = tmp_path / "evidence.json"
    summary = keep_evidence(env.redis, env.keys, [ip, other], DEFAULT_SHARDS, path)
    assert str(path) in summary and "2 outstanding IPs" in summary and "errors" not in summary
    doc = orjson.loads(path.read_bytes())
    [alloc] = doc["outstanding"][ip]["allocations"]
    assert (alloc["id"], alloc["shard"], alloc["node"]) == (alloc_id, shard, "node-a")
    assert alloc["decided"]["sequence_number"] == alloc["sequence_number"]
    assert alloc["candidate"] is not None and alloc["due"] is None
    [decision] = doc["outstanding"][ip]["decisions"]
    assert (decision["alloc_id"], decision["ip"]) == (alloc_id, ip)
    assert doc["outstanding"][ip]["audit"] == []
    assert doc["outstanding"][other] == {"allocations": [], "decisions": [], "audit": []}

    env.leader().step()  # released: the audit names it
    keep_evidence(env.redis, env.keys, [ip], DEFAULT_SHARDS, path)
    doc = orjson.loads(path.read_bytes())
    assert [r["result"] for r in doc["outstanding"][ip]["audit"]] == ["released"]
    assert doc["audit"] == doc["outstanding"][ip]["audit"]


def test_unreadable_marks_and_a_failing_redis_are_written_as_errors(env: Env, tmp_path: Path) -> None:
    ip, alloc_id, shard = decided_leak(env)
    env.redis.hset(env.keys.decided(shard), alloc_id, b"\xc1 not msgpack")
    path = tmp_path / "evidence.json"
    summary = keep_evidence(env.redis, env.keys, [ip], DEFAULT_SHARDS, path)
    assert "1 errors" in summary
    doc = orjson.loads(path.read_bytes())
    [alloc] = doc["outstanding"][ip]["allocations"]
    assert alloc["decided"] == {"unreadable": b"\xc1 not msgpack".hex()}
    down = redis.Redis(host="127.0.0.1", port=1, retry=Retry(NoBackoff(), 0))  # refused at once
    summary = keep_evidence(down, Keys("ipamgc"), [ip], DEFAULT_SHARDS, path)
    doc = orjson.loads(path.read_bytes())
    assert [e.split(":")[0] for e in doc["errors"]] == ["Redis"] and "1 errors" in summary
