"""Security fixtures: the real Redis (tests/redis), the leader's scenario environment (tests/leader), and
the simulated cluster over HTTP (tests/e2e)."""

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
