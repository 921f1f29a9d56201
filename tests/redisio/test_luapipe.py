"""`redisio.luapipe`: scripts in pipelines without SCRIPT EXISTS, and exactly once after Redis lost them."""

from __future__ import annotations

import pytest
import redis

from redisio import luapipe

INCR_BY = "return redis.call('INCRBY', KEYS[1], ARGV[1])"


def _calls(client: redis.Redis, command: str) -> int:
    stats = client.info("commandstats")
    entry = stats.get(f"cmdstat_{command}")
    return int(entry["calls"]) if isinstance(entry, dict) else 0


def test_a_pipeline_with_scripts_sends_no_script_exists(client: redis.Redis) -> None:
    script = client.register_script(INCR_BY)
    script(keys=["warm"], args=[1])  # loaded
    before = _calls(client, "script|exists")
    pipe = client.pipeline(transaction=False)
    luapipe.add(pipe, script, ["a"], [2])
    pipe.get("a")
    luapipe.add(pipe, script, ["b"], [3])
    assert luapipe.execute(pipe, client, [script]) == [2, b"2", 3]
    assert _calls(client, "script|exists") == before

    # redis-py's own way asks first, on every pipeline: what this module saves
    pipe = client.pipeline(transaction=False)
    script(keys=["a"], args=[1], client=pipe)
    pipe.execute()
    assert _calls(client, "script|exists") == before + 1


def test_after_redis_lost_its_scripts_every_command_runs_exactly_once(client: redis.Redis) -> None:
    incr = client.register_script(INCR_BY)
    other = client.register_script("return redis.call('APPEND', KEYS[1], ARGV[1])")
    incr(keys=["warm"], args=[1])
    other(keys=["warm-s"], args=["x"])
    client.script_flush()
    pipe = client.pipeline(transaction=False)
    luapipe.add(pipe, incr, ["n"], [5])
    pipe.incr("plain")
    luapipe.add(pipe, other, ["s"], ["ab"])
    luapipe.add(pipe, incr, ["n"], [1])
    assert luapipe.execute(pipe, client, [incr, other]) == [5, 1, 2, 6]
    assert (client.get("n"), client.get("plain"), client.get("s")) == (b"6", b"1", b"ab")
    assert client.script_exists(incr.sha, other.sha) == [True, True]


def test_another_error_is_raised_after_the_other_commands_ran(client: redis.Redis) -> None:
    script = client.register_script(INCR_BY)
    client.set("text", "not a number")
    pipe = client.pipeline(transaction=False)
    luapipe.add(pipe, script, ["text"], [1])
    pipe.incr("after")
    with pytest.raises(redis.ResponseError):
        luapipe.execute(pipe, client, [script])
    assert client.get("after") == b"1"
