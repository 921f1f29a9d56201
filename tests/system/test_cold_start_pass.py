"""A cold start re-validates every allocation through the workers' pass, a batch at a time, and decides the
leaks that were already there.

A watcher starting on a Redis never synced writes no dirty id for what its first list finds; opening the
gate starts a pass over every allocation per shard (`P:revalidate:{s}`), which the workers move into
dirty a batch at a time.  What users rely on: the leaks that happened while no collector ran are decided
as before, nothing in use is, and the pass ends.
"""

from __future__ import annotations

from pathlib import Path

import redis

from lab.apiserver.apiserver import SimApiServer
from lab.cluster.cluster import SimCluster
from shared.shard import DEFAULT_SHARDS
from tests.fixtures.redis import decisions
from tests.fixtures.stack import (
    KEYS,
    caught_up,
    fast_settings,
    quiescent,
    releasable_ips,
    running_watcher,
    worker_processes,
)
from tests.polling import wait_until


def test_leaks_from_before_the_cold_start_are_decided_through_the_pass(
    server: SimApiServer, sim: SimCluster, client: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    sim.bootstrap("1s")
    sim.populate(nodes=4, pods_per_node=6)
    sim.leak_pod_deleted_without_cni_del("ns-0", "pod-0000000")
    sim.leak_terminal_pod("ns-9", "pod-0000009")
    sim.leak_node_deleted("node-00003")
    expected = sim.truth.leaked_ips()
    assert len(expected) == 1 + 1 + 7  # node-00003: six pods and its tunnel IP
    with (
        running_watcher(server, fast_settings(redis_url)) as rw,
        # Batches of 3: the pass takes many refills per shard, with two workers sharing the shards.
        worker_processes(redis_url, [None, None], tmp_path, "--batch-size", "3") as workers,
    ):
        w = rw.watcher

        def settled() -> bool:
            found = decisions(client, KEYS)
            return caught_up(w, server) and quiescent(client) and releasable_ips(client, found) == expected

        wait_until(w.synced.is_set, timeout=20)
        wait_until(settled, timeout=40, what="every leak decided and the pass ended")
        assert releasable_ips(client, decisions(client, KEYS)) == expected, workers.output()
        assert not any(client.exists(KEYS.revalidate(s)) for s in range(DEFAULT_SHARDS))
