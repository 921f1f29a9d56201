"""Lua scripts in redis-py pipelines, without the SCRIPT EXISTS round trip redis-py adds to each one.

A `Script` queued on a pipeline (`script(keys=..., args=..., client=pipe)`) makes `pipe.execute()` first
send `SCRIPT EXISTS` for every script it holds and wait for the answer: one more round trip on every
pipeline that carries a script, which for ipamgc is the watcher's kick (every second) and each look and
batch of a lingering shard job (every pulse).  Here a script is queued as a bare `EVALSHA`; a command
that Redis refuses with NOSCRIPT (it restarted, or its scripts were flushed) is run once more, alone,
after the scripts named are loaded.  Every command so runs exactly once, as with redis-py's own way.

An adapter of the components (producer/, workers/): nothing of the domain imports it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import redis
from redis.commands.core import Script
from redis.exceptions import NoScriptError
from redis.typing import EncodableT, KeyT

from redisio.heldconn import HeldConnection, run


def add(
    pipe: redis.client.Pipeline, script: Script, keys: Sequence[KeyT], args: Sequence[EncodableT]
) -> None:
    """Queue `script` on `pipe` as a bare EVALSHA."""
    pipe.evalsha(script.sha, len(keys), *keys, *args)


def execute(
    pipe: redis.client.Pipeline,
    client: redis.Redis,
    scripts: Iterable[Script],
    held: HeldConnection | None = None,
) -> list[Any]:
    """`pipe.execute()` for a pipeline whose scripts were queued with `add`: a command refused with
    NOSCRIPT is run again on `client` once every one of `scripts` is loaded.  Any other error is raised
    (the first of them), after the other commands have run, as a pipeline without a transaction does.
    With `held`, the pipeline is sent on that thread's kept connection (`redisio.heldconn`)."""
    stack = list(pipe.command_stack)
    replies = run(pipe, held, raise_on_error=False)
    missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
    if missing:
        for script in scripts:
            script.sha = client.script_load(script.script)
        for i in missing:
            args, options = stack[i]
            replies[i] = client.execute_command(*args, **options)  # type: ignore[no-untyped-call]
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies
