"""Empty blocks of live nodes and everything of deleted nodes (§3.10, §3.11, §3.13)."""

from __future__ import annotations

from typing import Any

import pytest

from lab.apiserver.store import SimApiError
from lab.cluster.cluster import SimCluster
from lab.cluster.objects import node_object
from shared.blockops import library_empty, rfc3339
from shared.model import LABEL_NODE_NETWORK_DURING_MIGRATION
from shared.netaddr import cidr_to_name
from tests.fixtures.leader import GRACE, Env
from workers.leader.audit import Result
from workers.leader.cleanup import BlockNotEmpty, Done, release_block_affinity

COOLDOWN = 120


def _block(env: Env, cidr: str) -> dict[str, Any] | None:
    try:
        return env.server.store.get("ipamblocks", None, cidr_to_name(cidr))
    except SimApiError:
        return None


def _affinities(env: Env, node: str) -> list[str]:
    items = env.server.store.list("blockaffinities")["items"]
    return sorted(a["spec"]["cidr"] for a in items if a["spec"]["node"] == node)


def test_a_deleted_nodes_ips_blocks_and_affinities_go_in_one_pass(env: Env) -> None:
    sim = env.sim
    sim.add_node("node-a")
    sim.add_node("node-dead", dual_stack=True)
    for i in range(3):
        sim.create_pod("ns", f"d{i}", "node-dead", dual_stack=True)
    env.decide()
    lead = env.leader()
    blocks = _affinities(env, "node-dead")
    assert len(blocks) == 2  # one IPv4 and one IPv6 block

    sim.leak_node_deleted("node-dead")
    env.sync()
    assert {m.decode() for s in range(16) for m in env.redis.smembers(env.keys.dirtyblocks(s))} == set(blocks)
    env.validate()
    lead.step()
    assert _affinities(env, "node-dead") == []
    assert all(_block(env, c) is None for c in blocks)
    assert {m.decode() for s in range(16) for m in env.redis.smembers(env.keys.dirtyblocks(s))} == set()
    node_records = [r for r in env.audit() if r.rule == "node-missing" and not r.ip]
    assert sorted(r.block for r in node_records) == blocks
    assert all(r.result is Result.RELEASED and r.reason == "released" for r in node_records)
    # Deletes were conditional: soft delete (PUT deleted=true), then DELETE with uid + resourceVersion.
    deletes = [r for r in env.writes() if r.method == "DELETE"]
    assert deletes and all(r.precondition for r in deletes)
    assert sim.truth.violations == [] and sim.truth.leaked_ips() == set()
    assert env.consistent() == []


def test_borrowed_ips_of_live_pods_keep_a_deleted_nodes_affinity_with_backoff(env: Env) -> None:
    # Two /30 blocks in the whole pool: node-y fills its own and borrows from node-x's.
    sim = env.use_pools([("10.7.0.0/29", 30)])
    sim.add_node("node-x")
    sim.create_pod("ns", "x1", "node-x")
    sim.add_node("node-y")
    for i in range(4):
        sim.create_pod("ns", f"y{i}", "node-y")
    [x_block] = _affinities(env, "node-x")
    borrowed = sim.pod_handles[("ns", "y3")][1][0]
    assert borrowed.startswith("10.7.0.") and int(borrowed.rsplit(".", 1)[1]) < 4  # in node-x's block
    env.decide()
    lead = env.leader()

    sim.leak_node_deleted("node-x")
    y_leak = sim.leak_pod_deleted_without_cni_del("ns", "y0")
    env.decide()
    lead.step()  # node-x's own IPs go; its block still holds node-y's pod: "block is not empty"
    [refusal] = [r for r in env.audit() if r.rule == "node-missing" and not r.ip]
    assert refusal.result is Result.REFUSED_VALID and "not empty" in refusal.reason
    assert _affinities(env, "node-x") == [x_block]
    assert _block(env, x_block)["spec"]["affinity"] == "host:node-x"  # type: ignore[index]
    assert lead.deleted.backoff.failures("node-x") == 1

    # Other work is not held up: node-y's leak is released after its grace period, while node-x is
    # retried (after its back-off) and refused again, recorded once.
    env.sync()
    env.clock.advance(GRACE + 1)
    env.decide()
    lead.step()
    assert {r.ip for r in env.audit() if r.result is Result.RELEASED} >= set(y_leak)
    assert lead.deleted.backoff.failures("node-x") == 2
    assert len([r for r in env.audit() if r.rule == "node-missing" and not r.ip]) == 1
    lead.step()  # within its back-off: not even tried
    assert lead.deleted.backoff.failures("node-x") == 2

    # The borrowing pod goes (a clean CNI DEL): the next retry releases the block and the affinity.
    sim.delete_pod("ns", "y3")
    env.decide()
    env.clock.advance(30.0)
    lead.step()
    assert _affinities(env, "node-x") == [] and _block(env, x_block) is None
    assert sim.truth.violations == [] and sim.truth.leaked_ips() == set()
    assert env.consistent() == []


def test_without_must_be_empty_a_block_with_borrowed_ips_only_loses_its_affinity(env: Env) -> None:
    sim = env.use_pools([("10.7.0.0/29", 30)])
    sim.add_node("node-x")
    sim.add_node("node-y")
    for i in range(4):
        sim.create_pod("ns", f"y{i}", "node-y")  # the last one borrows from node-x's block
    [x_block] = _affinities(env, "node-x")
    sim.delete_node("node-x")
    api = env.api("manual")
    # What the GC does (must be empty): refused, nothing written.
    with pytest.raises(BlockNotEmpty):
        release_block_affinity(api, "node-x", x_block, lambda: None)
    assert env.writes("manual") == []
    # The library's other mode (calicoctl's): affinity cleared from the block, then the affinity deleted.
    assert release_block_affinity(api, "node-x", x_block, lambda: None, must_be_empty=False) is Done.RELEASED
    block = _block(env, x_block)
    assert block is not None and block["spec"]["affinity"] is None
    assert "affinityClaimTime" not in block["spec"]
    assert _affinities(env, "node-x") == []
    assert sim.truth.violations == []


def test_an_empty_block_of_a_live_node_goes_after_two_observations_more_than_grace_apart(env: Env) -> None:
    sim = env.sim
    sim.add_node("node-a")
    spare = sim.empty_block("node-a")
    env.server.store.create("nodes", None, node_object("node-lone"))  # no tunnel IP
    lone = sim.empty_block("node-lone")  # its only block: never released
    sim.add_node("node-mig", labels={LABEL_NODE_NETWORK_DURING_MIGRATION: "flannel"})
    migrating = sim.empty_block("node-mig")  # flannel migration under way: never released
    env.decide()
    lead = env.leader()
    lead.step()  # first observation
    first = float((env.redis.hget(env.keys.emptyblocks, spare) or b"0").split()[0])  # "<first> <since>"
    assert first == env.clock.now()
    assert env.redis.hget(env.keys.emptyblocks, lone) is None
    assert env.redis.hget(env.keys.emptyblocks, migrating) is None
    env.clock.advance(GRACE)
    lead.step()  # exactly the grace period later: not yet (strictly greater)
    assert _block(env, spare) is not None
    env.clock.advance(1.0)
    lead.step()
    assert _block(env, spare) is None
    assert _block(env, lone) is not None and _block(env, migrating) is not None
    assert env.redis.hget(env.keys.emptyblocks, spare) is None
    [rec] = [r for r in env.audit() if r.rule == "empty-block"]
    assert (rec.result, rec.block, rec.node) == (Result.RELEASED, spare, "node-a")
    env.sync()
    env.clock.advance(GRACE + 1)
    lead.step()
    assert _block(env, lone) is not None  # still its node's last block
    assert env.consistent() == []


def _unaffine(env: Env, cidr: str) -> None:
    """The block of `cidr` as the library leaves it after an affinity release that raced: no `affinity`,
    its BlockAffinity still there."""
    store = env.server.store
    name = cidr_to_name(cidr)
    block = store.get("ipamblocks", None, name)
    block["spec"]["affinity"] = None
    block["spec"].pop("affinityClaimTime", None)
    store.replace("ipamblocks", None, name, block)


def test_an_affinity_to_an_empty_unaffine_block_releases_the_block_as_calico_does(env: Env) -> None:
    """libcalico-go `releaseBlockAffinity` deletes a stale affinity only when the block is affine to
    *another* host (`b.Affinity != nil && !affinityMatches`); an unaffine block goes on: deleted when empty,
    then the affinity.  ipamgc called it another host's, deleted the affinity and left the block."""
    sim = env.sim
    sim.add_node("node-a")
    spare = sim.empty_block("node-a")
    _unaffine(env, spare)
    assert spare in _affinities(env, "node-a")
    done = release_block_affinity(env.api("manual"), "node-a", spare, lambda: None)
    assert done is Done.RELEASED
    assert _block(env, spare) is None and spare not in _affinities(env, "node-a")
    assert sim.truth.violations == []


def test_an_affinity_to_an_unaffine_block_in_use_is_refused_when_it_must_be_empty(env: Env) -> None:
    sim = env.use_pools([("10.7.0.0/29", 30)])
    sim.add_node("node-x")
    sim.add_node("node-y")
    for i in range(4):
        sim.create_pod("ns", f"y{i}", "node-y")  # the last one borrows from node-x's block
    [x_block] = _affinities(env, "node-x")
    _unaffine(env, x_block)
    api = env.api("manual")
    with pytest.raises(BlockNotEmpty):
        release_block_affinity(api, "node-x", x_block, lambda: None)
    assert _affinities(env, "node-x") == [x_block]  # kept: Calico refuses too
    assert _block(env, x_block) is not None
    assert sim.truth.violations == []


def test_a_deleted_nodes_block_holding_only_cooled_ips_is_empty_to_its_cleanup(env: Env) -> None:
    """Calico's library normalizes a block it reads (`blockFromBackend`) before "must be empty": an
    ordinal whose cooldown is over is free, so the deleted node's block goes with its affinity in the
    same pass, not after the cold-IP pass has rewritten it."""
    env.server.store.remove_hook(env.sim._on_commit)
    sim = SimCluster(env.server.store, seed=7, clock=env.clock.now, tunnel_type=None)
    env.sim = sim
    sim.bootstrap()
    sim.set_ip_cooldown(COOLDOWN)
    sim.add_node("node-a")
    sim.create_pod("ns", "keep", "node-a")
    sim.add_node("node-dead")
    sim.create_pod("ns", "p0", "node-dead")
    [block] = _affinities(env, "node-dead")
    env.decide()
    lead = env.leader()
    sim.delete_pod("ns", "p0")  # a clean CNI DEL: the IP is parked in cooldown
    spec = _block(env, block)["spec"]  # type: ignore[index]
    assert [spec["attributes"][i] for i in spec["allocations"] if i is not None] == [
        {"releasedAt": rfc3339(env.clock.now())}
    ]
    env.clock.advance(COOLDOWN + 1)
    sim.delete_node("node-dead")
    env.decide()
    lead.step()
    assert _affinities(env, "node-dead") == [] and _block(env, block) is None
    [rec] = [r for r in env.audit() if r.rule == "node-missing" and not r.ip]
    assert (rec.result, rec.block) == (Result.RELEASED, block)
    assert lead.deleted.backoff.failures("node-dead") == 0
    assert sim.truth.violations == [] and env.consistent() == []


def test_a_cooling_ip_still_keeps_a_deleted_nodes_block(env: Env) -> None:
    env.server.store.remove_hook(env.sim._on_commit)
    sim = SimCluster(env.server.store, seed=7, clock=env.clock.now, tunnel_type=None)
    env.sim = sim
    sim.bootstrap()
    sim.set_ip_cooldown(COOLDOWN)
    sim.add_node("node-a")
    sim.create_pod("ns", "keep", "node-a")
    sim.add_node("node-dead")
    sim.create_pod("ns", "p0", "node-dead")
    [block] = _affinities(env, "node-dead")
    env.decide()
    lead = env.leader()
    sim.delete_pod("ns", "p0")
    env.clock.advance(COOLDOWN - 1)
    sim.delete_node("node-dead")
    env.decide()
    lead.step()
    assert _affinities(env, "node-dead") == [block]  # not yet cooled: in use
    [rec] = [r for r in env.audit() if r.rule == "node-missing" and not r.ip]
    assert rec.result is Result.REFUSED_VALID and "not empty" in rec.reason


def test_a_refused_release_leaves_a_pending_deletion_affinity_as_calico_does(env: Env) -> None:
    """libcalico-go's `releaseBlockAffinity` returns "block is not empty" without writing: an affinity
    left `pendingDeletion` by an earlier attempt stays so (its host confirms it again on its next
    assignment, `getBlockFromAffinity`).  ipamgc used to write it back to `confirmed`."""
    sim = env.sim
    sim.add_node("node-x")
    sim.create_pod("ns", "x0", "node-x")
    [x_block] = _affinities(env, "node-x")
    store = env.server.store
    [aff] = [a for a in store.list("blockaffinities")["items"] if a["spec"]["node"] == "node-x"]
    aff["spec"]["state"] = "pendingDeletion"
    store.replace("blockaffinities", None, aff["metadata"]["name"], aff)
    api = env.api("manual")
    with pytest.raises(BlockNotEmpty):
        release_block_affinity(api, "node-x", x_block, lambda: None)
    assert env.writes("manual") == []
    [after] = [a for a in store.list("blockaffinities")["items"] if a["spec"]["node"] == "node-x"]
    assert after["spec"]["state"] == "pendingDeletion"


def test_a_release_keeps_the_affinity_of_a_block_whose_pool_no_longer_selects_its_node(env: Env) -> None:
    """A deliberate difference (README): Calico's library runs `ensureConsistentAffinity` after a release
    and drops the affinity of an empty block whose pool no longer selects the node; ipamgc keeps it (the
    node's own next assignment, or the empty-block pass, releases it)."""
    env.server.store.remove_hook(env.sim._on_commit)
    sim = SimCluster(env.server.store, seed=7, clock=env.clock.now, tunnel_type=None)
    env.sim = sim
    sim.bootstrap()
    sim.add_node("node-a")
    sim.create_pod("ns", "web-0", "node-a")
    [block] = _affinities(env, "node-a")
    env.decide()
    store = env.server.store
    for pool in store.list("ippools")["items"]:  # the operator: no pool selects node-a any more
        pool["spec"]["nodeSelector"] = "!all()"
        store.replace("ippools", None, pool["metadata"]["name"], pool)
    [ip] = sim.leak_pod_deleted_without_cni_del("ns", "web-0")
    env.decide()
    env.clock.advance(GRACE + 1)
    env.decide()
    lead = env.leader()
    lead.step()
    assert [r.ip for r in env.audit() if r.result is Result.RELEASED] == [ip]
    spec = _block(env, block)["spec"]  # type: ignore[index]
    assert library_empty(spec)  # empty: Calico's library would have dropped the affinity here
    assert spec["affinity"] == "host:node-a"
    assert _affinities(env, "node-a") == [block]
    assert sim.truth.violations == []
