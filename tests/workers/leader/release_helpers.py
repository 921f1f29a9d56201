"""What the leader's release tests (`test_release*.py`) share: whether an object is still in the simulated
API server's store."""

from __future__ import annotations

from lab.apiserver.store import SimApiError
from tests.fixtures.leader import Env


def _exists(env: Env, plural: str, name: str) -> bool:
    try:
        env.server.store.get(plural, None, name)
    except SimApiError:
        return False
    return True
