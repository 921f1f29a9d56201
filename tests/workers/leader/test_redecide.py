"""A decision the leader drops on the mirror's word goes back to the worker, which decides again.

The leader's gate settles a decision without asking the API when the mirror says the allocation is gone
("already free") or holds another sequence number ("refused: conflict"), or when a handle held it too
long.  The mirror can be caught mid-rebuild (a watcher relisting after it lost its Lease, a Redis that
restarted), and the worker's `decided` mark keeps it from deciding the same allocation again for
`REDECIDE_AFTER_SECONDS`.  So every such drop clears the mark and makes the allocation due again: a leak
that is still a leak is decided again within `hold_recheck_seconds`, not after five minutes (the long
chaos run of 2026-12-03 that released a leak late, docs/chaos.md).
"""

from __future__ import annotations

import dataclasses

from shared.gcrecords import handle_member_range
from shared.records import decode_allocation, encode_allocation
from tests.fixtures.leader import Env, decided_leak
from workers.leader.audit import Result

RECHECK = 5.0


def test_a_leak_dropped_as_gone_while_the_mirror_was_rebuilt_is_decided_again(env: Env) -> None:
    ip, alloc_id, shard = decided_leak(env)
    lead = env.leader(hold_recheck_seconds=RECHECK)
    # The mirror caught mid-rebuild: the allocation's record and handle index entry not yet written back.
    record = env.redis.hget(env.keys.alloc(shard), alloc_id)
    assert record is not None
    handle = decode_allocation(alloc_id, record).handle
    low, high = handle_member_range(handle)
    [member] = env.redis.zrange(env.keys.handles, low, high, bylex=True)
    env.redis.hdel(env.keys.alloc(shard), alloc_id)
    env.redis.zrem(env.keys.handles, member)
    lead.step()
    [dropped] = env.audit()
    assert (dropped.result, dropped.ip) == (Result.ALREADY_FREE, ip)
    assert env.redis.hget(env.keys.decided(shard), alloc_id) is None
    # The rebuild completes: the same allocation, the same sequence number.
    env.redis.hset(env.keys.alloc(shard), alloc_id, record)
    env.redis.zadd(env.keys.handles, {member: 0})
    assert env.validate() == 0  # due again after the recheck period, not at once
    env.clock.advance(RECHECK + 0.1)
    assert env.validate() == 1  # the grace period already ran: decided again at once
    lead.step()
    assert env.audit()[-1].result is Result.RELEASED and env.audit()[-1].ip == ip
    assert env.sim.truth.leaked_ips() == set() and env.sim.truth.violations == []


def test_a_leak_dropped_on_a_stale_sequence_number_in_the_mirror_is_decided_again(env: Env) -> None:
    ip, alloc_id, shard = decided_leak(env)
    lead = env.leader(hold_recheck_seconds=RECHECK)
    record = env.redis.hget(env.keys.alloc(shard), alloc_id)
    assert record is not None
    alloc = decode_allocation(alloc_id, record)
    # The mirror caught mid-rebuild from an older record of the block (another sequence number).
    stale = dataclasses.replace(alloc, sequence_number=alloc.sequence_number + 7)
    env.redis.hset(env.keys.alloc(shard), alloc_id, encode_allocation(stale))
    lead.step()
    [dropped] = env.audit()
    assert (dropped.result, dropped.ip) == (Result.REFUSED_CONFLICT, ip)
    env.redis.hset(env.keys.alloc(shard), alloc_id, record)  # caught up: the decided sequence number
    env.clock.advance(RECHECK + 0.1)
    assert env.validate() == 1
    lead.step()
    assert env.audit()[-1].result is Result.RELEASED and env.audit()[-1].ip == ip
    assert env.sim.truth.violations == []


def test_a_dry_run_leader_leaves_the_workers_marks_alone(env: Env) -> None:
    _ip, alloc_id, shard = decided_leak(env)
    lead = env.leader(hold_recheck_seconds=RECHECK, dry_run=True)
    env.redis.hdel(env.keys.alloc(shard), alloc_id)
    env.redis.delete(env.keys.handles)
    lead.step()
    assert env.audit()[-1].result is Result.ALREADY_FREE
    assert env.redis.hget(env.keys.decided(shard), alloc_id) is not None
    assert env.redis.zscore(env.keys.due(shard), alloc_id) is None
