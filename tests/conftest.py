"""The test tree mirrors the rooms: a module's tests live under tests/ at the module's own path
(`producer/mirror.py` → tests/producer/, `workers/leader/` → tests/workers/leader/, `lab/cluster/` →
tests/lab/cluster/); the whole system end to end is tests/system/, the house's rules across rooms
tests/house/, deploy/ and compose/ tests/deploy/, the real kube-apiserver tier tests/realapi/
(tests/README.md has the map).

Fixtures every test can use come from the plugin modules of tests/fixtures/ registered below: the
session's real Redis (`redis_endpoint`, `client`, `redis_url`, ...: tests/fixtures/redis.py), the
simulated API server over HTTP (`server`, `sim`, `api`, ...: tests/fixtures/kube.py) and the leader's
scenario environment (`env`, `env_v3`: tests/fixtures/leader.py).

Hypothesis profiles: CI explores a fixed set of examples (reproducible), developers random ones.
"""

from __future__ import annotations

import os

from hypothesis import settings

pytest_plugins = ["tests.fixtures.redis", "tests.fixtures.kube", "tests.fixtures.leader"]

settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev"))
