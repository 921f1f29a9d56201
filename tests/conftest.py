"""The test tree mirrors the rooms: a module's tests live under tests/ at the module's own path
(`producer/mirror.py` → tests/producer/, `workers/leader/` → tests/workers/leader/, `lab/cluster/` →
tests/lab/cluster/); the whole system end to end is tests/system/, the house's rules across rooms
tests/house/, deploy/ and compose/ tests/deploy/, the real kube-apiserver tier tests/realapi/
(tests/README.md has the map).

Fixtures every test can use come from the plugin modules of tests/fixtures/ registered below: the
session's real Redis (`redis_endpoint`, `client`, `redis_url`, ...: tests/fixtures/redis.py), the
simulated API server over HTTP (`server`, `sim`, `api`, ...: tests/fixtures/kube.py) and the leader's
scenario environment (`env`, `env_v3`: tests/fixtures/leader.py).

Tiers are markers, not folders (pyproject.toml registers them), set here on collection so that a new test
cannot forget its own: `redis` for a test that uses the session's Redis (a fixture of
tests/fixtures/redis.py, directly or through another fixture) or whose module starts a Redis of its own;
`kube` for one that uses the simulated API server (a fixture of tests/fixtures/kube.py, or the leader's
environment, which serves one) or whose module starts one (`SimApiServer`); `system` for every test of
tests/system/.  `slow` is set by hand; `realapi` by tests/realapi/conftest.py.  Select with `-m`:
`pytest -m redis`, `pytest -m 'not redis and not kube and not system'` (none of them; a test that runs a whole
command as a process, `ipamgc bench` or `chaos`, starts its servers there, unmarked).

Hypothesis profiles: CI explores a fixed set of examples (reproducible), developers random ones.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

pytest_plugins = ["tests.fixtures.redis", "tests.fixtures.kube", "tests.fixtures.leader"]

settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev"))

#: The tiers of a test that uses a fixture defined in one of these modules (directly or through another).
FIXTURE_TIERS: dict[str, tuple[str, ...]] = {
    "tests.fixtures.redis": ("redis",),
    "tests.fixtures.kube": ("kube",),
    "tests.fixtures.leader": ("redis", "kube"),
}
#: The tier of every test of a module that names one of these: it starts that server itself.
MODULE_TIERS: dict[str, str] = {
    "SimApiServer": "kube",
    "leader_env": "kube",
    "EmbeddedRedis": "redis",
    "find_redis_server": "redis",
    "redis_server_binary": "redis",
    "RedisProcess": "redis",
    "acl_redis": "redis",
}
SYSTEM = Path(__file__).resolve().parent / "system"


def tiers_of(item: pytest.Item) -> set[str]:
    tiers: set[str] = set()
    info = getattr(item, "_fixtureinfo", None)
    if info is not None:
        for name in getattr(item, "fixturenames", ()):
            defs = info.name2fixturedefs.get(name)
            if defs:  # the definition the test gets is the last (the closest)
                tiers.update(FIXTURE_TIERS.get(getattr(defs[-1].func, "__module__", ""), ()))
    module = getattr(item, "module", None)
    if module is not None:
        tiers.update(tier for name, tier in MODULE_TIERS.items() if name in vars(module))
    if SYSTEM in item.path.resolve().parents:
        tiers.add("system")
    return tiers


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for tier in sorted(tiers_of(item)):
            item.add_marker(tier)
