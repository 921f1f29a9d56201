"""Which shard owns an allocation: a stable hash of its `node` attribute.

The node is Calico's unit of validation (the tunnel rule and "node gone" decisions look at every
allocation of a node at once), so all of a node's allocations must land on one shard, and every process
must agree on the shard without talking to the others.  CRC-32 is stable across processes, Python
versions and restarts (unlike `hash()`, which is salted per process).
"""

from __future__ import annotations

import zlib

# Shards are the unit of parallel validation: one RQ job at a time per shard.  16 keeps a shard's dirty
# set small at 150,000 pods and is more than the worker processes a cluster usually runs; changing it
# needs an empty Redis (every per-shard key moves), so it is stored in the `state` hash and checked.
DEFAULT_SHARDS = 16


def shard_of(node: str, shards: int = DEFAULT_SHARDS) -> int:
    """The shard of every allocation whose `node` attribute is `node`."""
    if shards < 1:
        raise ValueError(f"shard count must be at least 1, got {shards}")
    return zlib.crc32(node.encode("utf-8")) % shards
