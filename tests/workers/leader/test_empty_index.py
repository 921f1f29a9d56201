"""The empty-block pass on the watcher's index (`P:empty`), and its backstop scan of every block (§3.10).

The in-process `Mirror` writes `P:empty` as the watcher does; these tests also write (or remove) its
entries themselves to set up what the watcher would have written or missed, and give the leader a
backstop period long enough that only its first pass scans.
"""

from __future__ import annotations

from typing import Any

import redis

from lab.apiserver.store import SimApiError
from lab.cluster.objects import node_object
from shared.blockrecords import BlockRecord, Slot, decode_block, encode_block
from shared.clock import FakeClock
from shared.gcrecords import EmptyBlock, decode_empty, encode_empty
from shared.keys import Keys
from shared.model import Node
from shared.netaddr import cidr_to_name
from shared.records import encode_node
from shared.shard import DEFAULT_SHARDS, shard_of
from tests.fixtures.leader import GRACE, Env
from workers.leader.audit import Result
from workers.leader.cleanup import Context, DeletedNodes
from workers.leader.empty_blocks import EmptyBlocks, Timer, parse_timer
from workers.leader.loop import Leader

LONG = 1e9  # a backstop period no test reaches: only a term's first pass scans every block


def _block(env: Env, cidr: str) -> dict[str, Any] | None:
    try:
        return env.server.store.get("ipamblocks", None, cidr_to_name(cidr))
    except SimApiError:
        return None


def _index(env: Env, cidr: str, host: str, since: float) -> None:
    """What the watcher writes when it sees `cidr` empty."""
    env.redis.hset(env.keys.empty, cidr, encode_empty(EmptyBlock(host, since)))


def _timer(env: Env, cidr: str) -> Timer | None:
    raw = env.redis.hget(env.keys.emptyblocks, cidr)
    return parse_timer(raw if isinstance(raw, bytes) else None)


def _released(env: Env) -> list[str]:
    return [r.block for r in env.audit() if r.rule == "empty-block" and r.result is Result.RELEASED]


def _indexed_leader(env: Env) -> Leader:
    return env.leader(empty_block_backstop_seconds=LONG)


def test_an_indexed_empty_block_goes_after_grace_and_a_nodes_last_block_stays(env: Env) -> None:
    env.sim.add_node("node-a")  # its tunnel IP's block is in use
    spare = env.sim.empty_block("node-a")
    env.server.store.create("nodes", None, node_object("node-lone"))  # no tunnel IP
    lone = env.sim.empty_block("node-lone")  # its only block: never released
    env.decide()
    t0 = env.clock.now()
    _index(env, spare, "node-a", t0)
    _index(env, lone, "node-lone", t0)
    lead = _indexed_leader(env)
    lead.step()  # first observation
    assert lead.empty.unindexed == {}  # the backstop found nothing the index lacks
    assert _timer(env, spare) == Timer(t0, t0)
    assert _timer(env, lone) is None
    env.clock.advance(GRACE)
    lead.step()  # exactly the grace period later: not yet (strictly greater)
    assert _block(env, spare) is not None
    env.clock.advance(1.0)
    lead.step()
    assert _block(env, spare) is None and _block(env, lone) is not None
    assert _released(env) == [spare]
    [rec] = [r for r in env.audit() if r.rule == "empty-block"]
    assert rec.evidence["since"] == t0 and rec.evidence["affine_blocks"] == 2
    assert _timer(env, spare) is None
    env.clock.advance(GRACE + 1)
    lead.step()
    assert _block(env, lone) is not None  # still its node's last block
    assert env.consistent() == []


def test_a_block_used_and_emptied_again_between_two_passes_restarts_its_timer(env: Env) -> None:
    """Calico's markInUse: the old scan saw the block empty at both passes and released it at the first
    emptiness + grace; the index's new `since` tells the pass it was used in between."""
    env.sim.add_node("node-a")
    spare = env.sim.empty_block("node-a")
    env.decide()
    t0 = env.clock.now()
    _index(env, spare, "node-a", t0)
    lead = _indexed_leader(env)
    lead.step()  # timer starts at t0
    assert _timer(env, spare) == Timer(t0, t0)
    # Used at t0 + 50 and emptied at t0 + 100, between two passes: the mirror's block record is empty
    # both times, only the index's `since` moved.
    _index(env, spare, "node-a", t0 + 100)
    env.clock.advance(GRACE + 1)
    lead.step()  # first emptiness + grace has passed: not released, the timer restarts now
    assert _block(env, spare) is not None and _released(env) == []
    assert _timer(env, spare) == Timer(t0 + GRACE + 1, t0 + 100)
    env.clock.advance(GRACE)
    lead.step()
    assert _block(env, spare) is not None
    env.clock.advance(1.0)
    lead.step()
    assert _released(env) == [spare] and _block(env, spare) is None


def test_a_watcher_clock_ahead_of_the_leaders_only_delays_the_release(env: Env) -> None:
    env.sim.add_node("node-a")
    spare = env.sim.empty_block("node-a")
    env.decide()
    ahead = env.clock.now() + 60.0  # the watcher's clock runs 60 s ahead
    _index(env, spare, "node-a", ahead)
    lead = _indexed_leader(env)
    lead.step()
    assert _timer(env, spare) == Timer(ahead, ahead)  # the later of the two clocks
    env.clock.advance(GRACE + 1)
    lead.step()
    assert _block(env, spare) is not None
    env.clock.advance(60.0)
    lead.step()
    assert _released(env) == [spare]


def test_unreadable_index_entries_are_skipped_and_counted_never_released(env: Env) -> None:
    env.sim.add_node("node-a")
    good = env.sim.empty_block("node-a")
    junk = env.sim.empty_block("node-a")
    shape = env.sim.empty_block("node-a")
    env.decide()
    t0 = env.clock.now()
    _index(env, good, "node-a", t0)
    env.redis.hset(env.keys.empty, junk, b"junk")
    env.redis.hset(env.keys.empty, shape, encode_empty(EmptyBlock("node-a", t0))[:-3])  # truncated
    env.redis.hset(env.keys.empty, "not-a-cidr", encode_empty(EmptyBlock("node-a", t0)))
    env.redis.hset(env.keys.empty, b"\xff\xfe", encode_empty(EmptyBlock("node-a", t0)))
    env.redis.hset(env.keys.emptyblocks, junk, repr(t0))  # a timer of an unreadable entry: cleared
    lead = _indexed_leader(env)
    lead.step()
    assert lead.empty.malformed == 4
    assert _timer(env, junk) is None and _timer(env, shape) is None
    env.clock.advance(10 * GRACE)
    lead.step()
    assert lead.empty.malformed == 8  # counted at every pass that skips them
    assert _released(env) == [good]
    assert _block(env, junk) is not None and _block(env, shape) is not None


def test_a_timer_of_a_block_no_longer_in_the_index_is_cleared(env: Env) -> None:
    env.sim.add_node("node-a")
    spare = env.sim.empty_block("node-a")
    env.decide()
    _index(env, spare, "node-a", env.clock.now())
    lead = _indexed_leader(env)
    lead.step()
    assert _timer(env, spare) is not None
    env.redis.hdel(env.keys.empty, spare)  # the watcher saw it used
    env.clock.advance(GRACE + 1)
    lead.step()
    assert _timer(env, spare) is None and _block(env, spare) is not None


def test_the_backstop_finds_a_host_block_whose_node_delete_was_missed(env: Env) -> None:
    env.sim.add_node("node-a")
    env.server.store.create("nodes", None, node_object("node-gone"))  # no tunnel IP: nothing to drain
    block = env.sim.empty_block("node-gone")
    env.decide()
    # The node goes while Redis loses the watcher's delete: no `dirtyblocks` entry, no index entry.
    env.server.store.delete("nodes", None, "node-gone")
    env.redis.hdel(env.keys.nodes, "node-gone")
    env.redis.hdel(env.keys.empty, block)
    assert all(not env.redis.smembers(env.keys.dirtyblocks(s)) for s in range(DEFAULT_SHARDS))
    lead = _indexed_leader(env)
    lead.empty.backstop()  # the scan alone names the node
    assert lead.deleted.orphans == {"node-gone"} and lead.empty.unindexed == {block: "node-gone"}
    lead.step()
    assert _block(env, block) is None
    node_records = [r for r in env.audit() if r.rule == "node-missing" and not r.ip]
    assert [(r.block, r.result) for r in node_records] == [(block, Result.RELEASED)]
    assert "node-gone" not in lead.deleted.orphans
    assert env.consistent() == []


def test_the_backstop_never_releases_earlier_than_the_index_would(env: Env) -> None:
    """An empty block missing from the index: its timer starts at the leader's first observation; a use
    seen in its record resets it, and only the next scan picks the block up again."""
    env.sim.add_node("node-a")
    spare = env.sim.empty_block("node-a")
    env.decide()
    env.redis.hdel(env.keys.empty, spare)  # missing from the index
    lead = _indexed_leader(env)
    lead.step()  # the term's first pass scans every block
    assert lead.empty.unindexed == {spare: "node-a"}
    t0 = env.clock.now()
    assert _timer(env, spare) == Timer(t0)
    env.clock.advance(GRACE)
    lead.step()
    assert _block(env, spare) is not None  # not before the grace period
    # The block is used: its record says so, the pass drops it and its timer.
    raw = env.redis.hget(env.keys.blocks, spare)
    assert isinstance(raw, bytes)
    empty_rec = decode_block(raw)
    used = BlockRecord(empty_rec.resource_version, empty_rec.uid, "node-a", 1, {0: Slot("h", 1, {})})
    env.redis.hset(env.keys.blocks, spare, encode_block(used))
    env.clock.advance(1.0)
    lead.step()
    assert lead.empty.unindexed == {} and _timer(env, spare) is None and _released(env) == []
    # Empty again: only the next scan sees it, and its timer starts then.
    env.redis.hset(env.keys.blocks, spare, encode_block(empty_rec))
    env.clock.advance(GRACE + 1)
    lead.step()
    assert _timer(env, spare) is None and _block(env, spare) is not None
    lead._next_backstop = float("-inf")
    lead.step()
    t1 = env.clock.now()
    assert _timer(env, spare) == Timer(t1)
    env.clock.advance(GRACE)
    lead.step()
    assert _block(env, spare) is not None
    env.clock.advance(1.0)
    lead.step()
    assert _released(env) == [spare]


def test_the_backstop_scans_again_once_the_mirror_is_rebuilt(env: Env) -> None:
    env.sim.add_node("node-a")
    env.decide()
    lead = _indexed_leader(env)
    lead.step()  # the term's scan: nothing
    spare = env.sim.empty_block("node-a")
    env.sync()
    env.redis.hdel(env.keys.empty, spare)  # the index misses it
    lead.step()
    assert lead.empty.unindexed == {}  # not indexed, and the next scan is far off
    env.redis.hdel(env.keys.state, "synced")  # Redis lost the mirror; the watcher relists
    lead.step()  # gated: the mirror is not synced
    env.sync()
    lead.step()
    assert lead.empty.unindexed == {spare: "node-a"}


def test_a_block_the_index_gains_leaves_the_backstops_list_and_restarts_its_timer(env: Env) -> None:
    env.sim.add_node("node-a")
    spare = env.sim.empty_block("node-a")
    env.decide()
    env.redis.hdel(env.keys.empty, spare)  # missing from the index
    lead = _indexed_leader(env)
    lead.step()
    assert lead.empty.unindexed == {spare: "node-a"}
    env.clock.advance(GRACE + 1)
    since = env.clock.now() - 5.0
    _index(env, spare, "node-a", since)  # the watcher caught up
    lead.step()  # a timer not started against this `since`: restarts (a later release only)
    assert lead.empty.unindexed == {}
    assert _timer(env, spare) == Timer(env.clock.now(), since) and _released(env) == []


# -- cost ------------------------------------------------------------------------------------------------


def _command_calls(client: redis.Redis) -> dict[str, int]:
    stats: dict[str, Any] = client.info("commandstats")  # type: ignore[assignment]
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}


def _output_bytes(client: redis.Redis) -> int:
    return int(client.info("stats")["total_net_output_bytes"])  # type: ignore[index]


def test_a_pass_reads_the_indexed_blocks_only(client: redis.Redis, keys: Keys, clock: FakeClock) -> None:
    """5,000 block records (150,000 allocations), 3 of them empty: a pass costs 6 commands and a few
    hundred bytes, whatever the block count; the backstop reads every record."""
    nodes, per_node, allocs = 1000, 5, 30
    pipe = client.pipeline(transaction=False)
    empties = []
    for n in range(nodes):
        node = f"node-{n}"
        pipe.hset(keys.nodes, node, encode_node(Node(name=node, uid=f"uid-{n}", labels={})))
        for b in range(per_node):
            i = n * per_node + b
            cidr = f"10.{i // 256}.{i % 256}.0/26"
            empty = i in (7, 2500, 4999)
            slots = {} if empty else {o: Slot(f"h-{i}-{o}", o, {"node": node}) for o in range(allocs)}
            pipe.hset(keys.blocks, cidr, encode_block(BlockRecord(str(i), f"u{i}", node, len(slots), slots)))
            pipe.sadd(keys.nodeblocks(shard_of(node, DEFAULT_SHARDS), node), cidr)
            if empty:
                empties.append(cidr)
                pipe.hset(keys.empty, cidr, encode_empty(EmptyBlock(node, clock.now())))
    pipe.execute()
    written: list[tuple[Any, ...]] = []

    def write(*args: Any) -> Any:
        written.append(args)
        return client.execute_command(*args)

    ctx = Context(client, keys, None, lambda: None, write, DEFAULT_SHARDS, False, lambda _: None)  # type: ignore[arg-type]
    passes = EmptyBlocks(ctx, DeletedNodes(ctx))
    passes.run(clock.now(), GRACE)  # first observations: the three timers start
    assert sorted(a[2] for a in written) == sorted(empties)
    clock.advance(5.0)
    calls, out = _command_calls(client), _output_bytes(client)
    passes.run(clock.now(), GRACE)
    # Bytes first: the INFO commandstats reply in between (it lists every command the session has used)
    # would be counted otherwise.
    sent = _output_bytes(client) - out
    after = _command_calls(client)
    delta = {k: n - calls.get(k, 0) for k, n in after.items() if n != calls.get(k, 0)}
    delta.pop("info", None)
    # P:empty and P:emptyblocks, one SCARD per host with an empty block, its node records.
    assert delta == {"hgetall": 2, "scard": 3, "hmget": 1}
    assert sent < 5_000  # P:blocks alone is ~13 MB
    assert len(written) == 3  # no further writes: the timers run
    calls, out = _command_calls(client), _output_bytes(client)
    passes.backstop()
    assert _command_calls(client).get("hscan", 0) > calls.get("hscan", 0)
    assert _output_bytes(client) - out > 1_000_000
    assert passes.unindexed == {}


def test_the_watcher_drops_a_block_from_the_index_while_it_is_used_and_re_adds_it_with_a_new_since(
    env: Env,
) -> None:
    """The watcher's half of Calico's markInUse: while in use a block is no candidate at all, and its next
    emptiness is a new one (the leader's timer restarts on the new `since`)."""
    sim = env.use_pools([("10.9.0.0/24", 30)])
    sim.add_node("node-a")
    for i in range(3):
        sim.create_pod("ns", f"p{i}", "node-a")  # node-a's first /30 is full
    spare = sim.empty_block("node-a")
    env.decide()
    t0 = env.clock.now()
    assert decode_empty(env.redis.hget(env.keys.empty, spare) or b"") == EmptyBlock("node-a", t0)
    sim.create_pod("ns", "p3", "node-a")  # into the spare block
    env.clock.advance(50.0)
    env.sync()
    assert env.redis.hget(env.keys.empty, spare) is None
    lead = _indexed_leader(env)
    env.clock.advance(GRACE + 1)
    lead.step()
    assert _released(env) == [] and _timer(env, spare) is None
    sim.delete_pod("ns", "p3")
    env.sync()
    assert decode_empty(env.redis.hget(env.keys.empty, spare) or b"") == EmptyBlock("node-a", env.clock.now())
