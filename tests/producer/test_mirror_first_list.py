"""A pod listed for the first time on a watcher's first listing does not re-dirty what is dirty already.

`Mirror.apply_pods` dirties the allocations its index lists for a pod whose record changed.  On a first
start on an empty Redis, before the workers' gate opens, every indexed allocation was published dirty by
this watcher and none can have been taken, so that lookup is skipped (`Mirror._first_listing`).  The
rest of the time it must not be: a watcher restarted on a mirror whose allocations were validated
before has to dirty a pod's allocations when the pod appears."""

from __future__ import annotations

import pytest
import redis

from producer.mirror import Mirror
from producer.relist import Kind
from shared.clock import FakeClock
from shared.keys import Keys
from tests.fixtures.redis import Cluster, dirty_ids
from tests.producer.mirror_helpers import build, node_ids, settle


def _calls(monkeypatch: pytest.MonkeyPatch, mirror: Mirror) -> list[str]:
    seen: list[str] = []
    real = mirror._dirty_owned

    def spy(writes: object, name: str) -> None:
        seen.append(name)
        real(writes, name)  # type: ignore[arg-type]

    monkeypatch.setattr(mirror, "_dirty_owned", spy)
    return seen


def _blocks_listed(mirror: Mirror, cluster: Cluster, *, shut_gate: bool = True) -> None:
    """Nodes and blocks listed, the pods not yet; the gate shut first, as the watcher does at its start."""
    if shut_gate:
        mirror.mark_synced(False)
    mirror.relist(Kind.NODES, cluster.nodes())
    mirror.relist(Kind.BLOCKS, cluster.blocks())


def _pod_dirties_its_allocations(
    monkeypatch: pytest.MonkeyPatch, mirror: Mirror, cluster: Cluster, pod: str, ids: list[str]
) -> None:
    """With nothing dirty, the pod seen for the first time looks up and dirties exactly its allocations."""
    settle(mirror.redis, mirror.keys)
    looked_up = _calls(monkeypatch, mirror)
    ns, name = pod.split("/", 1)
    mirror.apply_pods([cluster.pod(ns, name)])
    assert looked_up == [pod]
    assert dirty_ids(mirror.redis, mirror.keys) == set(ids)


def test_a_first_listing_does_not_look_up_what_it_published_dirty(
    monkeypatch: pytest.MonkeyPatch, client: redis.Redis, keys: Keys, mirror: Mirror, cluster: Cluster
) -> None:
    ids = build(cluster)
    _blocks_listed(mirror, cluster)
    assert mirror.memory.fresh
    everything = node_ids(ids, "web-0", "web-1", "db-0", "tunnel-1", "tunnel-2")
    assert dirty_ids(client, keys) == everything
    looked_up = _calls(monkeypatch, mirror)
    mirror.relist(Kind.PODS, cluster.pods())
    assert looked_up == []
    assert dirty_ids(client, keys) == everything  # nothing lost: it was all dirty already

    # Once the gate is open, a pod seen anew dirties its allocations as always.
    mirror.mark_synced(True)
    mirror.delete_pod("default", "web-0")
    _pod_dirties_its_allocations(monkeypatch, mirror, cluster, "default/web-0", ids["web-0"])


def test_a_restarted_watcher_dirties_the_allocations_of_a_pod_it_sees_first(
    monkeypatch: pytest.MonkeyPatch, client: redis.Redis, keys: Keys, cluster: Cluster, clock: FakeClock
) -> None:
    ids = build(cluster)
    first = Mirror(client, keys, clock=clock)
    _blocks_listed(first, cluster)  # the pods not listed yet when it stopped
    first.mark_synced(True)
    settle(client, keys)  # the workers validated everything (the pods missing: leak candidates)

    restarted = Mirror(client, keys, clock=clock)
    restarted.mark_synced(False)
    restarted.relist(Kind.NODES, cluster.nodes())
    assert not restarted.memory.fresh  # it found a mirror in Redis
    _pod_dirties_its_allocations(monkeypatch, restarted, cluster, "default/web-0", ids["web-0"])


def test_a_reloaded_memory_is_never_fresh(
    monkeypatch: pytest.MonkeyPatch, client: redis.Redis, mirror: Mirror, cluster: Cluster
) -> None:
    # After a half-applied batch the memory is rebuilt from Redis, which may hold part of a batch whose
    # dirty marks were not written: from then on every new pod dirties what is indexed for it.
    ids = build(cluster)
    _blocks_listed(mirror, cluster)
    assert mirror.memory.fresh
    mirror.memory.load(client, mirror.keys)
    assert not mirror.memory.fresh
    _pod_dirties_its_allocations(monkeypatch, mirror, cluster, "default/db-0", ids["db-0"])


def test_a_mirror_that_never_shut_the_gate_dirties_as_always(
    monkeypatch: pytest.MonkeyPatch, mirror: Mirror, cluster: Cluster
) -> None:
    ids = build(cluster)
    _blocks_listed(mirror, cluster, shut_gate=False)
    _pod_dirties_its_allocations(monkeypatch, mirror, cluster, "default/web-1", ids["web-1"])
