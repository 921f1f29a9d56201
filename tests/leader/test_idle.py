"""An idle leader waits on the decisions stream: a new decision ends the wait at once, a stop or a lost
Lease within a second, and without Redis it falls back to sleeping (never a busy loop)."""

from __future__ import annotations

import threading

from tests.leader.conftest import Env

LONG_WAIT = 30.0  # far beyond any join below: only an early wake-up ends the wait in time


def _waiting(env: Env) -> tuple[threading.Thread, threading.Event]:
    lead = env.leader()
    stop = threading.Event()
    t = threading.Thread(target=lead.idle, args=(stop, LONG_WAIT), daemon=True)
    t.start()
    return t, stop


def test_a_new_decision_ends_the_idle_wait(env: Env) -> None:
    t, stop = _waiting(env)
    t.join(0.3)
    assert t.is_alive()  # blocked on the stream, not spinning out
    env.redis.xadd(env.keys.decisions, {"id": "x", "d": b"\x00"})
    t.join(10)
    assert not t.is_alive()
    stop.set()


def test_a_stop_ends_the_idle_wait_within_a_slice(env: Env) -> None:
    t, stop = _waiting(env)
    t.join(0.3)
    assert t.is_alive()
    stop.set()
    t.join(10)
    assert not t.is_alive()
