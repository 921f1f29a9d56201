"""Blocks are written in chunks bounded by the allocations they hold, not only by their count.

A block carries up to 64 allocations where a pod carries one or two, and each chunk of a relist is one
pipeline whose writes are gathered, packed and read by Redis whole: a list page of 500 real blocks was
~25,000 allocations in one pipeline, the watcher's peak at a cold start.  What a user relies on: however
a relist is cut into pipelines, the mirror it leaves is the one a single pipeline leaves.
"""

from __future__ import annotations

import redis

from producer.blockmirror import ALLOCATIONS_PER_OBJECT, chunks
from producer.mirror import Mirror
from producer.relist import Kind
from shared.blockrecords import MirroredBlock
from shared.keys import STATE_GENERATION, Keys
from shared.model import IPAMBlock
from tests.fixtures.redis import Cluster, dirty_ids
from tests.producer.test_mirror_consistency import mirror_all, snapshot


def _cluster(nodes: int, pods_per_node: int) -> Cluster:
    cluster = Cluster()
    b = cluster.builder
    for n in range(nodes):
        b.add_node(f"node-{n}")
        for p in range(pods_per_node):
            b.add_pod("default", f"pod-{n}-{p}", f"node-{n}")
    return cluster


def _generation(client: redis.Redis, keys: Keys) -> int:
    return int(client.hget(keys.state, STATE_GENERATION) or 0)


def _allocations(block: IPAMBlock | MirroredBlock | None) -> int:
    assert not isinstance(block, MirroredBlock)
    return 1 if block is None else sum(1 for a in block.allocations if a is not None)


def test_a_chunk_holds_at_most_its_allocation_budget_and_a_heavier_block_goes_alone() -> None:
    cluster = _cluster(6, 20)  # each node's block holds its tunnel IP and 20 pods: 21 allocations
    latest = {b.cidr_str: b for b in cluster.blocks()} | {"10.99.0.0/26": None}
    size = 4  # a budget of 32 allocations: one 21-allocation block a chunk
    cut = list(chunks(latest, size))
    assert [cidr for c in cut for cidr, _ in c] == list(latest)  # every block, in order, once
    for c in cut:
        held = sum(_allocations(b) for _, b in c)
        assert len(c) <= size
        assert held <= size * ALLOCATIONS_PER_OBJECT or len(c) == 1
    assert len(cut) == 6  # the gone block rides with the last one
    assert len(list(chunks(latest, 500))) == 1


def test_a_relist_cut_into_many_pipelines_leaves_the_mirror_one_pipeline_leaves(
    client: redis.Redis, keys: Keys
) -> None:
    cluster = _cluster(8, 20)
    client.flushall()
    mirror_all(Mirror(client, keys), cluster)  # chunks of 500: every block in one pipeline
    whole, whole_dirty = snapshot(client, keys), dirty_ids(client, keys)

    client.flushall()
    cut = Mirror(client, keys, chunk=4)
    cut.relist(Kind.NODES, cluster.nodes())
    cut.relist(Kind.PODS, cluster.pods())
    before = _generation(client, keys)  # each pipeline of the watcher's counts one
    cut.relist(Kind.BLOCKS, cluster.blocks())
    assert _generation(client, keys) - before == 8  # 21 allocations a block, a budget of 32: one a pipeline
    assert snapshot(client, keys) == whole
    assert dirty_ids(client, keys) == whole_dirty
