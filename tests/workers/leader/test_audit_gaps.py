"""Audit records lost from Redis are reported as lost: each record carries its writer's sequence number
(`workers/leader/audit_seq.py`), the leader numbers on above what Redis forgot, and `ipamgc audit` names
the gap ("N records lost between seq A and B"), the leader's metric counts it, and the log lines carry the
same numbers (the lost records are found there)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from ipamgc.commands.audit import audit
from shared import metrics_names as m
from tests.fixtures.leader import Env
from tests.workers.leader.test_audit_log import audit_lines
from workers.leader.audit import AuditRecord, Result, numbered
from workers.leader.audit_seq import AuditSequence, Gap, find_gaps
from workers.leader.report_release import _append


@pytest.fixture(autouse=True)
def _keep_logging() -> Iterator[None]:
    """`ipamgc audit` configures the root logger (as entry points do); put it back afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def test_a_writer_numbers_above_its_own_last_and_the_streams_newest() -> None:
    seq = AuditSequence()
    assert seq.take(3, 0) == (1, 0) and seq.last == 3
    assert seq.take(1, 3) == (4, 0)
    assert seq.take(2, None) == (5, 0)  # Redis unreadable: memory alone
    assert seq.take(1, 9) == (10, 0)  # another writer (release --from-report) wrote 7 … 9
    assert seq.take(1, 7) == (11, 3) and seq.lost == 3  # Redis went back: 8, 9, 10 lost
    assert seq.take(0, 11) == (12, 0) and seq.last == 11


def test_gaps_are_the_holes_in_the_set_of_numbers() -> None:
    assert find_gaps([]) == [] and find_gaps([0, 0, 5]) == []
    assert find_gaps([7, 3, 4, 0, 9, 5]) == [Gap(5, 7), Gap(7, 9)]
    assert str(Gap(40, 45)) == "4 records lost between seq 40 and 45"
    assert str(Gap(1, 3)) == "1 record lost between seq 1 and 3"


def _url(env: Env) -> str:
    kw = env.redis.connection_pool.connection_kwargs
    return f"redis://{kw['host']}:{kw['port']}/0"


def _record(ip: str) -> AuditRecord:
    return AuditRecord(Result.RELEASED, ip=ip, handle="h", block="10.0.0.0/26", node="node-dead")


def test_records_lost_in_a_failover_are_reported_as_a_gap_with_their_log_lines(env: Env) -> None:
    env.redis.hset(env.keys.state, "synced", "1")
    lead = env.leader()
    with audit_lines() as got:
        for i in range(5):  # five passes, one record each: seq 1 … 5
            lead.trail.record(_record(f"10.0.0.{i + 1}"))
            lead.trail.flush()
        # The failover: the replica promoted had the first two records only.
        newest: list[Any] = list(env.redis.xrevrange(env.keys.audit, count=3) or [])
        env.redis.xdel(env.keys.audit, *[entry_id for entry_id, _ in newest])
        lead.trail.record(_record("10.0.0.6"))
        lead.trail.flush()
    stream = env.audit()
    assert [r.seq for r in stream] == [1, 2, 6]  # numbered on above what Redis forgot
    assert [line["seq"] for line in got.lines] == [1, 2, 3, 4, 5, 6]
    lost = [line["ip"] for line in got.lines if line["seq"] in (3, 4, 5)]
    assert lost == ["10.0.0.3", "10.0.0.4", "10.0.0.5"]  # the log pipeline has them
    assert lead.metrics.registry.get_sample_value(m.AUDIT_RECORDS_LOST + "_total") == 3

    # `ipamgc release --from-report` numbers above the stream's newest too: no gap of its own.
    records, _ = numbered(env.redis, env.keys, AuditSequence(), [_record("10.0.0.7")])
    _append(env.redis, env.keys, records)
    assert [r.seq for r in env.audit()] == [1, 2, 6, 7]

    runner = CliRunner()
    doc = orjson.loads(runner.invoke(audit, ["--redis-url", _url(env), "-o", "json", "--limit", "0"]).stdout)
    assert doc["gaps"] == [{"after": 2, "before": 6, "lost": 3}]
    assert [r["seq"] for r in doc["records"]] == [1, 2, 6, 7]
    table = runner.invoke(audit, ["--redis-url", _url(env)])
    assert table.exit_code == 0
    assert "ipamgc audit: 3 records lost between seq 2 and 6" in table.stderr
    # --cluster filters what is printed, not what the gap check reads.
    filtered = runner.invoke(audit, ["--redis-url", _url(env), "--cluster", "nowhere", "-o", "json"])
    assert orjson.loads(filtered.stdout)["gaps"] == [{"after": 2, "before": 6, "lost": 3}]


def test_records_written_before_numbers_existed_are_left_out_of_the_check(env: Env) -> None:
    env.redis.hset(env.keys.state, "synced", "1")
    _append(env.redis, env.keys, [_record("10.0.0.1")])  # seq 0: an older leader's record
    lead = env.leader()
    lead.trail.record(_record("10.0.0.2"))
    lead.trail.flush()
    assert [r.seq for r in env.audit()] == [0, 1]
    doc = orjson.loads(CliRunner().invoke(audit, ["--redis-url", _url(env), "-o", "json"]).stdout)
    assert doc["gaps"] == []


def test_the_table_shows_a_repaired_record(env: Env) -> None:
    """The handle collector's `repaired` records had no style in the table: a KeyError on any stream
    holding one."""
    env.redis.hset(env.keys.state, "synced", "1")
    repaired = AuditRecord(Result.REPAIRED, handle="k8s-pod-network.x", rule="handle-over-counted", seq=1)
    _append(env.redis, env.keys, [repaired, _record("10.0.0.2")])  # seq 1 and 0: no gap
    table = CliRunner().invoke(audit, ["--redis-url", _url(env)])
    assert table.exit_code == 0, table.output
    assert "repaired" in table.stdout
