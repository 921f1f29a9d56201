"""Chaos fixtures: the seed of a run, and the switch for the long runs.

The seed comes from `--chaos-seed N` (when pytest is pointed at this directory: `pytest tests/lab/chaos
--chaos-seed N`), else `IPAMGC_CHAOS_SEED`, else 0 in CI (a fixed schedule) and a random one elsewhere;
it is printed, and a failure names the command that replays its schedule.  The long runs
(`IPAMGC_CHAOS_LONG=1`, marked `slow`) are skipped by default.  The real Redis, the simulated cluster over
HTTP and the leader's scenario environment are the fixtures of tests/fixtures/ (every test's).
"""

from __future__ import annotations

import os
import random

import pytest

LONG = os.environ.get("IPAMGC_CHAOS_LONG") == "1" or os.environ.get("IPAMGC_SLOW") == "1"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--chaos-seed", type=int, default=None, help="seed of the chaos runs (replay a failure)")


@pytest.fixture
def chaos_seed(request: pytest.FixtureRequest) -> int:
    seed = request.config.getoption("--chaos-seed", default=None)
    if seed is None and os.environ.get("IPAMGC_CHAOS_SEED"):
        seed = int(os.environ["IPAMGC_CHAOS_SEED"])
    if seed is None:
        seed = 0 if os.environ.get("CI") else random.SystemRandom().randrange(10_000)
    print(f"chaos seed {seed}: replay with IPAMGC_CHAOS_SEED={seed} pytest tests/lab/chaos")
    return int(seed)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if LONG:
        return
    skip = pytest.mark.skip(reason="long chaos runs: set IPAMGC_CHAOS_LONG=1")
    for item in items:
        if "slow" in item.keywords and "tests/lab/chaos" in str(item.fspath):
            item.add_marker(skip)
