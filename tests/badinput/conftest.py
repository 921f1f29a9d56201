"""Bad-input fixtures: the real Redis, the simulated cluster over HTTP and the real watcher (tests/e2e), and
the leader's scenario environment (tests/leader)."""

from __future__ import annotations

from tests.e2e import conftest as e2e
from tests.leader import conftest as leader
from tests.redis import conftest as redis_fixtures

redis_endpoint = redis_fixtures.redis_endpoint
client = redis_fixtures.client
keys = redis_fixtures.keys
clock = redis_fixtures.clock
redis_url = e2e.redis_url
server = e2e.server
sim = e2e.sim
env = leader.env
