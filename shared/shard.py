"""Which shard owns an allocation: a stable hash of its `node` attribute.

The node is Calico's unit of validation (the tunnel rule and "node gone" decisions look at every
allocation of a node at once), so all of a node's allocations must land on one shard, and every process
must agree on the shard without talking to the others.  CRC-32 is stable across processes, Python
versions and restarts (unlike `hash()`, which is salted per process).
"""

from __future__ import annotations

import zlib

# Shards are the unit of parallel validation: at most one worker serves a shard at a time, so the shard
# count caps the worker processes that help.  Sized to the deployment (2 worker replicas, an HPA up to 4),
# not to the cluster: a shard costs ~30 Redis commands and ~0.2 ms of worker CPU for every 1 s batch that
# touches it, whatever its size, and at 50 pod events/s every batch touches every shard (`ipamgc bench`,
# 10,000 pods: 16 shards 13.7 Redis commands per pod event, 4 shards 6.0, the same CPU otherwise), while
# one worker validates ~25,000 allocations/s, so 4 workers re-validate 150,000 pods in under 2 s.  Run more
# shards only to run more than 4 workers at once.  Changing it needs an empty Redis (every per-shard key
# moves), so it is stored in the `state` hash and checked.
DEFAULT_SHARDS = 4


def shard_of(node: str, shards: int = DEFAULT_SHARDS) -> int:
    """The shard of every allocation whose `node` attribute is `node`."""
    if shards < 1:
        raise ValueError(f"shard count must be at least 1, got {shards}")
    return zlib.crc32(node.encode("utf-8")) % shards
