"""The leader's releases bounded per pass and rate limited per second: a deleted node's IPs take their own
token bucket, a live node's leaks the shared one; a rate-limited backlog waits for a batch of tokens."""

from __future__ import annotations

from typing import Any

import pytest

from tests.fixtures.leader import GRACE, Env
from workers.leader.rate_limit import TokenBucket


def _dead_node_with_pods(env: Env, pods: int) -> None:
    sim = env.sim
    sim.add_node("node-a")
    sim.add_node("node-dead")
    for i in range(pods):
        sim.create_pod("ns", f"p{i}", "node-dead")
    env.decide()
    sim.leak_node_deleted("node-dead")
    assert env.decide() == pods + 1


def test_releases_per_pass_are_bounded(env: Env) -> None:
    _dead_node_with_pods(env, 5)
    lead = env.leader(max_releases_per_pass=2)
    for expected in (2, 4, 6):
        lead.step()
        assert lead.stats.released == expected
    assert env.sim.truth.violations == [] and env.sim.truth.leaked_ips() == set()


def test_releases_per_second_are_rate_limited(env: Env) -> None:
    _dead_node_with_pods(env, 5)
    t = [0.0]
    lead = env.leader(deleted_node_rate_limit=2.0, monotonic=lambda: t[0])
    lead.step()
    lead.step()  # the bucket is empty: nothing more until time passes
    assert lead.stats.released == 2
    t[0] = 1.0
    lead.step()
    assert lead.stats.released == 4
    t[0] = 10.0
    lead.step()
    assert lead.stats.released == 6
    assert env.sim.truth.violations == [] and env.sim.truth.leaked_ips() == set()


def test_a_rate_limited_pass_reads_the_mirror_for_what_it_can_release(env: Env) -> None:
    # 20 handles due at once (a lost node), 2 releases a second: each pass reads the mirror for the
    # handles it can release, oldest first, not for all 21 again (quadratic in a lost node's pods).
    _dead_node_with_pods(env, 20)
    t = [0.0]
    lead = env.leader(deleted_node_rate_limit=2.0, monotonic=lambda: t[0])
    read: list[list[str]] = []
    real = lead.gate._read_mirror

    def spy(handles: list[str]) -> Any:
        read.append(list(handles))
        return real(handles)

    lead.gate._read_mirror = spy  # type: ignore[method-assign]
    lead.step()
    assert lead.stats.released == 2
    assert [len(handles) for handles in read] == [2]
    lead.step()  # the bucket is empty: nothing is read, nothing released
    assert lead.stats.released == 2 and len(read) == 1
    for second in range(1, 12):
        t[0] = float(second)
        lead.step()
    assert lead.stats.released == 21
    assert sum(len(handles) for handles in read) == 21  # each handle read once
    assert env.sim.truth.violations == [] and env.sim.truth.leaked_ips() == set()


def test_a_deleted_node_s_ips_take_their_own_bucket_and_a_live_node_s_leaks_the_shared_one(env: Env) -> None:
    # A dead node's 6 IPs (5 pods and its tunnel, a handle each) and a live node's leak, due together:
    # the shared limit (1/s) lets the live node's leak go; the deleted node's own (2/s) two of its IPs a
    # second, whatever the shared bucket holds, and neither holds back the other.
    _dead_node_with_pods(env, 5)
    sim = env.sim
    sim.create_pod("ns", "gone", "node-a")
    env.decide()
    sim.leak_pod_deleted_without_cni_del("ns", "gone")
    env.decide()
    env.sync()
    env.clock.advance(GRACE + 1)
    assert env.decide() > 0
    t = [0.0]
    lead = env.leader(rate_limit=1.0, deleted_node_rate_limit=2.0, monotonic=lambda: t[0])
    lead.step()
    assert lead.stats.released == 1 + 2  # both buckets start full
    lead.step()
    assert lead.stats.released == 3  # both empty
    for second, released in ((1, 5), (2, 7)):
        t[0] = float(second)
        lead.step()
        assert lead.stats.released == released
    assert sim.truth.leaked_ips() == set() and sim.truth.violations == []


def test_token_bucket() -> None:
    t = [0.0]
    bucket = TokenBucket(2.0, monotonic=lambda: t[0])
    assert bucket.take(2) and not bucket.take(1)
    assert bucket.wait_for(1) == 0.5
    t[0] = 0.5
    assert bucket.take(1) and not bucket.take(1)
    assert TokenBucket(0).take(10**6)


def test_a_rate_limited_backlog_waits_for_a_batch_of_tokens_not_one(env: Env) -> None:
    # 21 handles due, 20 releases a second: once the bucket is empty the leader sleeps until a quarter
    # of a second's worth has come (5 tokens), not 1/20 s: a pass re-sorts everything due.
    _dead_node_with_pods(env, 20)
    t = [0.0]
    lead = env.leader(deleted_node_rate_limit=20.0, monotonic=lambda: t[0])
    lead.step()
    assert lead.stats.released == 20
    assert lead.gate.next_due(lead.clock.now()) == pytest.approx(0.05)  # one handle left: one token
    _dead_node_with_pods_more(env)
    lead.step()
    assert lead.gate.next_due(lead.clock.now()) == pytest.approx(0.25)


def _dead_node_with_pods_more(env: Env) -> None:
    sim = env.sim
    sim.add_node("node-dead-2")
    for i in range(10):
        sim.create_pod("ns", f"q{i}", "node-dead-2")
    env.decide()
    sim.leak_node_deleted("node-dead-2")
    env.decide()
