"""A pipeline sent on a connection its thread keeps, without redis-py's per-pipeline bookkeeping.

Why: on these machines a redis-py pipeline of five small commands cost 117–147 µs of client CPU where
the same bytes sent and read on the same connection cost 53–77 µs, and a bare socket with hiredis 26–31
(`docs/benchmarks-history.md`, "After the held connections").  The difference is `Pipeline.execute`'s work per
call: a connection taken from the pool and given back (a lock, a fork check and a non-blocking read to
see that the connection holds no stale reply: three system calls), observability hooks, and the retry
wrapper built anew.  ipamgc's hot paths are a few pipelines a second per thread (a lingering shard job's
look, validation and writes; the watcher's batch; its kick), so that fixed cost was a large part of a
worker's CPU.

`HeldConnection.execute(pipe)` runs a non-transactional pipeline as `pipe.execute()` would — the same
commands in one write, each reply through the client's response callbacks, an error reply returned in its
place or raised, the connection's `Retry` on connection errors (the connection is disconnected first, as
redis-py does) — on one connection taken from the client's pool once and kept. A connection that failed is
given back to the pool (disconnected); the next call takes another. The first thread to execute holds the
connection (it is not locked); another thread's pipelines take redis-py's own path while it is held. The
owner gives it back (`release`) when done. Anything else (a transaction, WATCH,
scripts registered on the pipeline) goes through `pipe.execute()`.

The commands are packed with `hiredis.pack_command` itself, the bytes redis-py's hiredis packer sends
without its per-argument type checks in Python, and each reply's callback is looked up once per command
name: 5.6–7.4 µs per command of a 100-command pipeline before, 3.2–3.7 after (`docs/benchmarks-history.md`,
"After the lean requests").

An adapter of the components (producer/, workers/): nothing of the domain imports it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import redis
from hiredis import pack_command as _hiredis_pack  # redis[hiredis] is a dependency
from redis.client import EMPTY_RESPONSE, NEVER_DECODE, Pipeline
from redis.connection import Connection

# The packer redis-py uses when hiredis is installed: only then are commands packed here, with hiredis
# itself, byte for byte what that packer sends (its per-argument type checks in Python were most of it).
_HIREDIS_PACKER = getattr(redis.connection, "HiredisRespSerializer", None)
# redis-py's cut-off for joining small commands into one buffer (`Connection._buffer_cutoff`).
_BUFFER_CUTOFF = 6000


class HeldConnection:
    """One connection of `client`'s pool kept for one thread's pipelines (see the module docstring)."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._conn: Connection | None = None
        self._owner: int | None = None  # the thread that holds `_conn`
        self._callbacks: dict[Any, Callable[..., Any] | None] = {}  # command name → its response callback

    def execute(self, pipe: Pipeline, raise_on_error: bool = True) -> list[Any]:
        """`pipe.execute(raise_on_error)` on the held connection; the pipeline is reset after it."""
        # `transaction` is an instance attribute of a Pipeline (a method of the client class it shadows)
        transaction = vars(pipe).get("transaction", True)
        if transaction or pipe.explicit_transaction or pipe.watching or pipe.scripts:
            return pipe.execute(raise_on_error)
        if self._owner != threading.get_ident():
            if self._conn is not None:  # another thread holds the connection: the pool serves this one
                return pipe.execute(raise_on_error)
            self._owner = threading.get_ident()
        stack = list(pipe.command_stack)
        pipe.reset()
        if not stack:
            return []
        conn = self._conn
        if conn is None:
            conn = self._conn = self.client.connection_pool.get_connection()

        def send() -> list[Any]:
            conn.send_packed_command(_pack(conn, [args for args, _ in stack]))  # type: ignore[no-untyped-call]
            replies: list[Any] = []
            for args, options in stack:
                try:
                    replies.append(self._reply(conn, args[0], options))
                except redis.ResponseError as exc:
                    replies.append(exc)
            return replies

        try:
            drop = conn.disconnect
            replies = conn.retry.call_with_retry(send, lambda _error: drop())  # type: ignore[no-untyped-call]
        except BaseException:
            self.close()  # a reply half read, or no connection: never reused as it is
            raise
        if raise_on_error:
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
        return replies

    def _reply(self, conn: Connection, name: Any, options: dict[str, Any]) -> Any:
        """`client.parse_response(conn, name, **options)`, with the callback looked up once per command
        name (the client's callback table is case-insensitive: an upper-casing per lookup)."""
        if options and (NEVER_DECODE in options or EMPTY_RESPONSE in options):
            return self.client.parse_response(conn, name, **dict(options))  # type: ignore[no-untyped-call]
        response = conn.read_response()
        if name in self._callbacks:
            callback = self._callbacks[name]
        else:
            table = self.client.response_callbacks
            # `in` and `[]`, not `get`: the table is a CaseInsensitiveDict whose `get` is dict's own.
            callback = self._callbacks[name] = table[name] if name in table else None  # noqa: SIM401
        if callback is None:
            return response
        if "keys" in options:
            options = {k: v for k, v in options.items() if k != "keys"}
        return callback(response, **options)

    def release(self) -> None:
        """Give the connection back to the pool as it is (its owner is done with it)."""
        conn, self._conn, self._owner = self._conn, None, None
        if conn is not None:
            self.client.connection_pool.release(conn)

    def close(self) -> None:
        """Give the connection back to the pool, disconnected (the next `execute` takes another)."""
        conn, self._conn, self._owner = self._conn, None, None
        if conn is not None:
            conn.disconnect()  # type: ignore[no-untyped-call]
            self.client.connection_pool.release(conn)


def _pack(conn: Connection, commands: Sequence[tuple[Any, ...]]) -> list[bytes]:
    """`conn.pack_commands(commands)`: the same bytes, in pieces joined up to redis-py's cut-off, each
    command packed by hiredis directly; a command hiredis does not take (a multi-word name, an argument
    of another type) is packed by the connection, which raises what redis-py raises for it."""
    if _HIREDIS_PACKER is None or not isinstance(getattr(conn, "_command_packer", None), _HIREDIS_PACKER):
        return conn.pack_commands(commands)  # type: ignore[no-untyped-call,no-any-return]
    output: list[bytes] = []
    pieces: list[bytes] = []
    size = 0
    for args in commands:
        name = args[0]
        packed: bytes | None = None
        if not (" " in name if isinstance(name, str) else b" " in name):
            try:
                packed = _hiredis_pack(args)
            except TypeError:
                packed = None
        if packed is None:
            packed = b"".join(conn.pack_command(*args))  # type: ignore[no-untyped-call]
        if pieces and (size > _BUFFER_CUTOFF or len(packed) > _BUFFER_CUTOFF):
            output.append(b"".join(pieces))
            pieces, size = [], 0
        if len(packed) > _BUFFER_CUTOFF:
            output.append(packed)
        else:
            pieces.append(packed)
            size += len(packed)
    if pieces:
        output.append(b"".join(pieces))
    return output


def run(pipe: Pipeline, held: HeldConnection | None, raise_on_error: bool = True) -> list[Any]:
    """`pipe.execute()`, on `held` when given."""
    return held.execute(pipe, raise_on_error) if held is not None else pipe.execute(raise_on_error)
