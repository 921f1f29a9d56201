"""Key names: per-shard keys share one Cluster slot; shards are stable across processes."""

from __future__ import annotations

import pytest
from redis.crc import key_slot

from shared.keys import Keys
from shared.shard import DEFAULT_SHARDS, shard_of


@pytest.mark.parametrize("shard", [0, 3, 15])
def test_every_key_of_a_shard_is_in_one_cluster_slot(shard: int) -> None:
    keys = Keys()
    names = [
        keys.alloc(shard),
        keys.dirty(shard),
        keys.inflight(shard),
        keys.queued(shard),
        keys.cand(shard),
        keys.due(shard),
        keys.decided(shard),
        keys.dirtyblocks(shard),
        keys.nodeallocs(shard, "node-1"),
        keys.nodeblocks(shard, "node-1"),
    ]
    assert len({key_slot(n.encode()) for n in names}) == 1
    assert all(f"{{{shard}}}" in n for n in names)


def test_global_keys_carry_the_prefix_and_no_hash_tag() -> None:
    keys = Keys("gc")
    for name in (
        keys.blocks,
        keys.pods,
        keys.nodes,
        keys.decisions,
        keys.state,
        keys.pulses,
        keys.old_pulse,
        keys.empty,
        keys.handles,
        keys.old_handle("h"),
    ):
        assert name.startswith("gc:") and "{" not in name


def test_prefix_cannot_smuggle_a_hash_tag() -> None:
    with pytest.raises(ValueError):
        Keys("a{b}")


def test_shard_of_is_a_stable_crc32() -> None:
    # Pinned: every process (watcher, workers, leader, any version) must agree.
    assert [shard_of(n, 16) for n in ("node-1", "node-2", "node-3")] == [15, 5, 3]
    assert all(0 <= shard_of(f"n{i}") < DEFAULT_SHARDS for i in range(100))
    with pytest.raises(ValueError):
        shard_of("node-1", 0)
