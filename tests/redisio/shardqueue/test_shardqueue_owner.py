"""The shard queue's protocol has one owner (issue 47): `redisio.shardqueue`.  Its scripts each say what
they touch, and neither the watcher (`producer/`) nor the workers (`workers/`) write the `queued:{s}`
flag, register a shard-queue script or define an RQ job of their own: they import the protocol's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from redisio.shardqueue import jobs, lua

ROOT = Path(__file__).resolve().parents[3]
SCRIPTS = {
    name: value
    for name, value in vars(lua).items()
    if name.isupper() and isinstance(value, str) and value.lstrip().startswith("--")
}


def test_the_protocol_holds_every_script_of_the_shard_queue() -> None:
    assert set(SCRIPTS) == {
        "TAKE",
        "ACK",
        "NACK",
        "REFILL",
        "REAP",
        "PROMOTE",
        "FINISH",
        "HOLD",
        "STEP",
        "RELEASE",
        "KICK",
    }


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_every_script_documents_its_keys_and_args_and_takes_time_as_an_argument(name: str) -> None:
    header = [line for line in SCRIPTS[name].strip().splitlines() if line.startswith("--")]
    assert any("KEYS[1]" in line for line in header)
    assert any("ARGV" in line for line in header)
    assert "TIME" not in SCRIPTS[name]


@pytest.mark.parametrize("package", ["producer", "workers"])
def test_the_components_use_the_protocol_rather_than_repeat_it(package: str) -> None:
    repeated = re.compile(r"\.queued\b|rq\.Queue\(|[\"']workers\.validate\.shard_job[\"']|def dumps\(")
    found = {
        str(path.relative_to(ROOT)): match.group(0)
        for path in sorted((ROOT / package).rglob("*.py"))
        if (match := repeated.search(path.read_text(encoding="utf-8")))
    }
    assert found == {}
    assert jobs.SHARD_JOB == "workers.validate.shard_job"  # the path RQ stores: `workers/validate.py`
