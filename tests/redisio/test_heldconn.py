"""`redisio.heldconn`: a pipeline on a kept connection answers exactly as `pipe.execute()` does."""

from __future__ import annotations

import threading

import pytest
import redis

from redisio import luapipe
from redisio.heldconn import HeldConnection, run


def _fill(pipe: redis.client.Pipeline) -> None:
    pipe.set("a", "1", nx=True)
    pipe.set("a", "2", nx=True)  # refused: None through the SET callback
    pipe.hset("h", mapping={"f": "v", "g": "w"})
    pipe.hgetall("h")  # a dict through the callback
    pipe.hmget("h", ["f", "missing"])
    pipe.sadd("s", "x", "y")
    pipe.xadd("x", {"b": "1"})
    pipe.xread({"x": "0-0"}, count=10)
    pipe.zadd("z", {"m": 1.5})
    pipe.zrangebyscore("z", 0, 2, withscores=True)


def _normalized(replies: list[object]) -> list[object]:
    out = list(replies)
    out[6] = b"<id>"  # the XADD id
    out[7] = [[key, [(b"<id>", fields) for _, fields in entries]] for key, entries in out[7]]  # type: ignore[attr-defined]
    return out


def test_replies_are_those_of_pipe_execute(client: redis.Redis) -> None:
    pipe = client.pipeline(transaction=False)
    _fill(pipe)
    expected = _normalized(pipe.execute())
    client.flushall()
    held = HeldConnection(client)
    pipe = client.pipeline(transaction=False)
    _fill(pipe)
    assert _normalized(held.execute(pipe)) == expected
    assert len(pipe) == 0  # reset, as execute leaves it
    held.release()


def test_the_connection_is_kept_across_pipelines_and_given_back(client: redis.Redis) -> None:
    pool = client.connection_pool
    held = HeldConnection(client)
    ids = set()
    for i in range(20):
        pipe = client.pipeline(transaction=False)
        pipe.client_id()
        pipe.incr("n")
        ident, n = held.execute(pipe)
        ids.add(ident)
        assert n == i + 1
    assert len(ids) == 1  # one connection for all twenty
    assert pool._in_use_connections  # held out of the pool while its owner runs
    held.release()
    assert not pool._in_use_connections
    assert client.client_id() in ids  # given back connected: the next command reuses it


def test_an_error_reply_is_returned_in_place_or_raised(client: redis.Redis) -> None:
    held = HeldConnection(client)
    client.set("str", "x")
    pipe = client.pipeline(transaction=False)
    pipe.incr("n")
    pipe.hget("str", "f")  # WRONGTYPE
    pipe.incr("n")
    replies = held.execute(pipe, raise_on_error=False)
    assert replies[0] == 1 and replies[2] == 2
    assert isinstance(replies[1], redis.ResponseError)
    pipe = client.pipeline(transaction=False)
    pipe.incr("n")
    pipe.hget("str", "f")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        held.execute(pipe)
    assert client.get("n") == b"3"  # every command ran, as in a pipeline without a transaction
    pipe = client.pipeline(transaction=False)
    pipe.incr("n")
    assert held.execute(pipe) == [4]  # the connection is still in step after the error replies
    held.release()


def test_a_killed_connection_is_replaced(client: redis.Redis) -> None:
    held = HeldConnection(client)
    pipe = client.pipeline(transaction=False)
    pipe.client_id()
    (first,) = held.execute(pipe)
    client.client_kill_filter(_id=first)
    pipe = client.pipeline(transaction=False)
    pipe.client_id()
    pipe.incr("n")
    try:
        replies = held.execute(pipe)
    except redis.ConnectionError:  # a client configured without retries: the next call reconnects
        pipe = client.pipeline(transaction=False)
        pipe.client_id()
        pipe.incr("n")
        replies = held.execute(pipe)
    assert replies[0] != first and replies[1] == 1
    held.release()


def test_a_transaction_and_no_held_connection_take_redis_pys_own_path(client: redis.Redis) -> None:
    held = HeldConnection(client)
    pipe = client.pipeline(transaction=True)
    pipe.incr("n")
    pipe.incr("n")
    assert held.execute(pipe) == [1, 2]
    pipe = client.pipeline(transaction=False)
    pipe.incr("n")
    assert run(pipe, None) == [3]
    assert run(client.pipeline(transaction=False), held) == []
    held.release()


def test_scripts_on_a_held_connection_survive_a_script_flush(client: redis.Redis) -> None:
    script = client.register_script("return redis.call('INCRBY', KEYS[1], ARGV[1])")
    held = HeldConnection(client)
    pipe = client.pipeline(transaction=False)
    luapipe.add(pipe, script, ["a"], [2])
    with pytest.raises(redis.ResponseError):  # not loaded: NOSCRIPT, without luapipe's reload
        held.execute(pipe)
    pipe = client.pipeline(transaction=False)
    luapipe.add(pipe, script, ["a"], [2])
    pipe.incr("b")
    assert luapipe.execute(pipe, client, [script], held) == [2, 1]
    client.script_flush()
    pipe = client.pipeline(transaction=False)
    luapipe.add(pipe, script, ["a"], [3])
    assert luapipe.execute(pipe, client, [script], held) == [5]
    held.release()


def test_another_thread_takes_the_pool_while_one_holds_the_connection(client: redis.Redis) -> None:
    held = HeldConnection(client)
    pipe = client.pipeline(transaction=False)
    pipe.client_id()
    (mine,) = held.execute(pipe)
    theirs: list[object] = []

    def other() -> None:
        p = client.pipeline(transaction=False)
        p.client_id()
        theirs.extend(held.execute(p))

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert theirs and theirs[0] != mine
    held.release()
    t = threading.Thread(target=other)  # released: the next thread to execute holds it
    t.start()
    t.join()
    assert len(theirs) == 2
    held.release()


def test_commands_are_packed_to_the_bytes_redis_py_sends(client: redis.Redis) -> None:
    """`_pack` (hiredis directly) against the connection's own `pack_commands`: multi-word names, every
    argument type, values past the join cut-off; an argument redis-py refuses is refused alike.  What is
    asserted is what the server receives (the bytes) and that a command past the cut-off is sent as a
    piece of its own, never copied into a buffer with its neighbours; how redis-py itself splits a
    pipeline into pieces is its own business (it changed in redis-py 8.2)."""
    from redisio.heldconn import _BUFFER_CUTOFF, _pack

    big = ("HSET", "h", "f", b"v" * 10_000, "é", 1.5, 7)
    commands = [
        big,
        ("SCRIPT LOAD", "return 1"),
        ("SET", b"k", memoryview(b"mv")),
        ("SADD", "s", *(f"m{i}" for i in range(500))),
        ("GET", "k"),
    ]
    conn = client.connection_pool.get_connection()
    try:
        pieces = _pack(conn, commands)
        assert b"".join(pieces) == b"".join(conn.pack_commands(commands))
        # the oversized command is a piece alone: exactly its own bytes
        packed_big = b"".join(conn.pack_command(*big))
        assert len(packed_big) > _BUFFER_CUTOFF and pieces[0] == packed_big
        # the rest are whole small commands, in order, each piece closed once it passed the cut-off
        small = [b"".join(conn.pack_command(*c)) for c in commands[1:]]
        assert b"".join(pieces[1:]) == b"".join(small)
        assert all(len(p) <= _BUFFER_CUTOFF + max(map(len, small)) for p in pieces[1:])
        with pytest.raises(redis.DataError):
            _pack(conn, [("SET", "k", True)])
    finally:
        client.connection_pool.release(conn)


def test_an_error_reply_and_callback_options_match_pipe_execute(client: redis.Redis) -> None:
    def fill(pipe: redis.client.Pipeline) -> None:
        pipe.set("str", "x")
        pipe.incr("str")  # an error reply in its place
        pipe.zadd("z", {"a": 2.0}, incr=True)  # `as_score`: the callback's option
        pipe.zscore("z", "a")
        pipe.get("missing")

    pipe = client.pipeline(transaction=False)
    fill(pipe)
    expected = [repr(r) if isinstance(r, Exception) else r for r in pipe.execute(raise_on_error=False)]
    client.flushall()
    held = HeldConnection(client)
    pipe = client.pipeline(transaction=False)
    fill(pipe)
    got = [repr(r) if isinstance(r, Exception) else r for r in held.execute(pipe, raise_on_error=False)]
    assert got == expected and isinstance(got[2], float)
    held.release()
