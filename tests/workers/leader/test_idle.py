"""An idle leader waits on the decisions stream: a new decision ends the wait at once, a stop or a lost
Lease within a slice (`WAKE_SLICE_SECONDS`), and without Redis it falls back to sleeping (never a busy
loop)."""

from __future__ import annotations

import threading

from tests.fixtures.leader import Env
from tests.polling import wait_until

LONG_WAIT = 30.0  # far beyond any join below: only an early wake-up ends the wait in time


def _waiting(env: Env) -> tuple[threading.Thread, threading.Event]:
    lead = env.leader()
    stop = threading.Event()
    t = threading.Thread(target=lead.idle, args=(stop, LONG_WAIT), daemon=True)
    t.start()
    return t, stop


def _blocked_on_the_stream(env: Env) -> bool:
    """Redis itself says a client is blocked in XREAD (deterministic, no waiting out a timer)."""
    return any(c.get("cmd") == "xread" and "b" in c.get("flags", "") for c in env.redis.client_list())


def test_a_new_decision_ends_the_idle_wait(env: Env) -> None:
    t, stop = _waiting(env)
    wait_until(lambda: _blocked_on_the_stream(env), what="the leader to block on the stream")
    assert t.is_alive()  # blocked on the stream, not spinning out
    env.redis.xadd(env.keys.decisions, {"id": "x", "d": b"\x00"})
    t.join(10)
    assert not t.is_alive()
    stop.set()


def test_a_stop_ends_the_idle_wait_within_a_slice(env: Env) -> None:
    t, stop = _waiting(env)
    wait_until(lambda: _blocked_on_the_stream(env), what="the leader to block on the stream")
    assert t.is_alive()
    stop.set()
    t.join(10)
    assert not t.is_alive()


def test_a_decision_appended_while_a_pass_ran_ends_the_next_wait_at_once(env: Env) -> None:
    """The wait starts after the newest entry the leader read, not at the stream's end: an entry that
    arrived between the pass's read and the wait is not slept through."""
    env.decide()  # a synced mirror: the pass reads the stream
    lead = env.leader()
    env.redis.xadd(env.keys.decisions, {"id": "old", "d": b"\x00"})
    lead.step()  # reads (and drops, unreadable) the old entry
    env.redis.xadd(env.keys.decisions, {"id": "new", "d": b"\x00"})  # after the read, before the wait
    stop = threading.Event()
    t = threading.Thread(target=lead.idle, args=(stop, LONG_WAIT), daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive()
    stop.set()


def test_a_quiet_leader_cleans_every_30_s_and_an_active_one_every_5(env: Env) -> None:
    env.decide()  # a synced mirror, no decision
    lead = env.leader(
        cleanup_interval_seconds=5.0,
        idle_cleanup_interval_seconds=30.0,
        idle_seconds=60.0,
        heartbeat_seconds=1e9,
    )
    assert lead.step() == 30.0  # quiet: the cleanup pass ran, the next is 30 s away
    env.redis.xadd(env.keys.decisions, {"id": "x", "d": b"\x00"})  # a decision (unreadable: dropped)
    assert lead.step() == 5.0  # active: the next cleanup pass within 5 s
    env.clock.advance(5)
    assert lead.step() == 5.0
    env.clock.advance(61)  # a minute without a decision
    assert lead.step() == 30.0
