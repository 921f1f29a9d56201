"""The audit trail outside Redis: every record the leader (and `ipamgc release`) writes to the audit stream
is also one `ipamgc.audit` log line, the record as JSON, kept at INFO whatever the log level, and logged
even when Redis refuses the write (a Redis at its maxmemory, `noeviction`)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
import redis

from tests.fixtures.leader import Env
from workers.leader.audit import AuditRecord, Result
from workers.leader.report_release import _append


class _Lines(logging.Handler):
    """The `ipamgc.audit` messages that reach the root logger's handlers, parsed."""

    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.lines: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.name == "ipamgc.audit":
            assert record.levelno == logging.INFO
            self.lines.append(orjson.loads(record.getMessage()))


@contextlib.contextmanager
def audit_lines(root_level: int = logging.WARNING) -> Iterator[_Lines]:
    """A handler on the root logger, as `configure_logging` installs one, with the root at `root_level`
    (`--log-level WARNING`: the audit lines must still come through)."""
    root = logging.getLogger()
    handler = _Lines()
    level = root.level
    root.addHandler(handler)
    root.setLevel(root_level)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def _as_logged(r: AuditRecord) -> dict[str, Any]:
    doc = {"v": "1", **r.as_json()}
    del doc["id"]
    return doc


def _dead_node(env: Env) -> set[str]:
    sim = env.sim
    sim.add_node("node-a")
    sim.add_node("node-dead")
    sim.create_pod("ns", "p1", "node-dead")
    sim.create_pod("ns", "p2", "node-a")
    env.decide()
    sim.leak_node_deleted("node-dead")
    assert env.decide() > 0
    return sim.truth.leaked_ips()


def test_every_release_and_refusal_is_one_json_line_with_the_stream_records_fields(env: Env) -> None:
    leaked = _dead_node(env)
    env.redis.xadd(env.keys.decisions, {"id": "x", "d": b"\x93not-a-record"})  # recorded as an error
    with audit_lines() as got:
        env.leader().step()
    stream = env.audit()
    assert {r.ip for r in stream if r.result is Result.RELEASED and r.ip} == leaked
    assert any(r.result is Result.ERROR for r in stream) and any(not r.ip for r in stream)  # a block
    assert got.lines == [_as_logged(r) for r in stream]
    assert all(line["cluster_uid"] == stream[0].cluster_uid for line in got.lines)
    assert got.lines[0]["evidence"] == dict(stream[0].evidence)  # an object, not a string


def test_a_record_redis_refuses_at_its_maxmemory_is_still_logged(env: Env) -> None:
    _dead_node(env)
    lead = env.leader()
    released = AuditRecord(Result.RELEASED, ip="10.0.0.9", handle="h", block="10.0.0.0/26", node="node-dead")
    before = env.redis.config_get("maxmemory")["maxmemory"]
    try:
        env.redis.config_set("maxmemory", 1)  # below what it holds: every write is refused (noeviction)
        # redis-py takes the `OOM` prefix of Redis's error into the exception's class
        refusal = "command not allowed when used memory > 'maxmemory'"
        with audit_lines() as got, pytest.raises(redis.exceptions.OutOfMemoryError, match=refusal):
            lead.trail.record(released)
            lead.trail.flush()
        [line] = got.lines
        assert line["result"] == "released" and line["ip"] == "10.0.0.9" and line["leader"] == "leader-a"
        assert line["epoch"] == lead.fence.epoch > 0

        refused = AuditRecord(Result.REFUSED_VALID, ip="10.0.0.10", reason="in use")
        with audit_lines() as got:  # `ipamgc release --from-report`: its records, logged the same way
            _append(env.redis, env.keys, [refused])
        assert got.lines == [_as_logged(refused)]
    finally:
        env.redis.config_set("maxmemory", before)
    assert env.audit() == []  # nothing reached the stream: the log lines are the only copy
