"""A watch event the watcher never saw: no periodic pass can tell (the mirror and the watcher's memory
agree; Calico's full scan re-reads the same kind of cache), so the backstop keeps the IP, and the next
relist (a 410, a watch error) dirties the leak.  What the README's "The periodic backstop" says, shown on
the mirror with a pod delete dropped."""

from __future__ import annotations

import redis

from producer.backstop import Backstop
from producer.mirror import Mirror
from producer.reflector import WatchStats
from producer.relist import Kind
from shared.keys import Keys
from tests.fixtures.redis import Cluster, dirty_ids
from tests.producer.mirror_helpers import build, settle


def test_a_dropped_pod_delete_keeps_the_ip_until_the_next_relist(
    client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster
) -> None:
    ids = build(cluster)
    mirror.relist(Kind.NODES, cluster.nodes())
    mirror.relist(Kind.PODS, cluster.pods())
    mirror.relist(Kind.BLOCKS, cluster.blocks())
    mirror.mark_synced(True)
    settle(client, keys)
    relists: list[Kind] = []
    backstop = Backstop(mirror, WatchStats(), relists.append)

    del cluster.builder.pods[("default", "db-0")]  # deleted without a CNI DEL; its watch event dropped
    assert backstop.run() == 0
    assert dirty_ids(client, keys) == set() and relists == []  # nothing tells: the IP is kept

    mirror.relist(Kind.PODS, cluster.pods())  # what a relist after a 410 or a watch error does
    assert dirty_ids(client, keys) == set(ids["db-0"])
    settle(client, keys)
    assert backstop.run() == len(ids["db-0"])  # and from then on every pass hands the leak back
