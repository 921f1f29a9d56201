"""`ipamgc status` reads the whole system's state from Redis alone, as a table and as JSON."""

from __future__ import annotations

import io
import json

import redis
from click.testing import CliRunner
from rich.console import Console

from ipamgc.commands.status import render, status
from ipamgc.status import read_status
from shared.keys import (
    STATE_GRACE,
    STATE_IP_COOLDOWN,
    STATE_KUBEVIRT,
    STATE_LAST_FULL_RESYNC,
    STATE_SHARDS,
    STATE_SYNCED,
    Keys,
)
from tests.fixtures.redis import Endpoint


def _seed(client: redis.Redis, keys: Keys) -> None:
    client.hset(
        keys.state,
        mapping={
            STATE_SYNCED: "1",
            STATE_GRACE: "900",
            STATE_SHARDS: "4",
            STATE_LAST_FULL_RESYNC: "990",
            STATE_IP_COOLDOWN: "120",
        },
    )
    client.sadd(keys.dirty(1), "h/10.0.0.1", "h/10.0.0.2")
    client.zadd(keys.inflight(2), {"h/10.0.0.3": 1030})
    client.hset(keys.cand(3), "h/10.0.0.4", b"x")
    client.rpush(f"rq:queue:{keys.queue_name(1)}", "job-1")
    client.hset(
        keys.leader("ipamgc-leader"), mapping={"identity": "leader-0", "epoch": "7", "acquired_at": "940"}
    )
    client.xadd(keys.audit, {"result": "released", "ip": "10.0.0.9"})
    client.xadd(keys.audit, {"result": "refused-valid", "ip": "10.0.0.8"})
    client.xadd(keys.audit, {"result": "released", "ip": "10.0.0.7"})


def test_status_reads_everything_from_redis(client: redis.Redis, keys: Keys) -> None:
    _seed(client, keys)
    st = read_status(client, keys, now=1000.0)
    assert st.synced and st.datastore_ready
    assert not st.kubevirt  # KubeVirt not listed: the VM rule is off
    assert st.leak_grace_period == 900.0
    assert st.ip_cooldown == 120
    assert st.last_full_resync_age == 10.0
    assert [(s.shard, s.dirty, s.inflight, s.candidates, s.queue) for s in st.shards] == [
        (0, 0, 0, 0, 0),
        (1, 2, 0, 0, 1),
        (2, 0, 1, 0, 0),
        (3, 0, 0, 1, 0),
    ]
    assert st.leader == {"identity": "leader-0", "epoch": 7, "lease_age": 60.0, "heartbeat_age": None}
    assert st.releases == {"refused-valid": 1, "released": 2}
    assert st.totals == {
        "dirty": 2,
        "inflight": 1,
        "candidates": 1,
        "queued_jobs": 1,
        "revalidating_shards": 0,
    }
    client.hset(keys.state, STATE_KUBEVIRT, "1")
    assert read_status(client, keys, now=1000.0).kubevirt
    out = io.StringIO()
    Console(file=out, width=120).print(render(st))
    text = out.getvalue()
    assert "leader: leader-0" in text and "epoch: 7" in text and "released 2" in text
    assert "lease age: 60.0s" in text and "heartbeat: -" in text and "-s" not in text
    assert "IP cooldown: 120s" in text


def test_status_prints_a_dash_for_what_is_missing(client: redis.Redis, keys: Keys) -> None:
    out = io.StringIO()
    Console(file=out, width=200).print(render(read_status(client, keys, now=1000.0)))  # an empty Redis
    text = out.getvalue()
    assert "leader: -" in text and "lease age: -" in text and "heartbeat: -" in text
    assert "-s" not in text


def test_status_command_json_and_unreachable_redis(
    client: redis.Redis, keys: Keys, redis_endpoint: Endpoint
) -> None:
    _seed(client, keys)
    url = f"redis://{redis_endpoint.host}:{redis_endpoint.port}/0"
    result = CliRunner().invoke(status, ["--redis-url", url, "--output", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["totals"]["dirty"] == 2 and len(doc["shards"]) == 4
    assert result.stderr == f"ipamgc status: Redis {url} (--redis-url)\n"  # always says which Redis
    table = CliRunner().invoke(status, ["--redis-url", url])
    assert table.exit_code == 0 and "shards" in table.output
    down = CliRunner().invoke(status, ["--redis-url", "redis://127.0.0.1:1/0"])
    assert down.exit_code == 2
    assert down.stderr.splitlines()[-1].startswith("ipamgc status: error: Redis redis://127.0.0.1:1/0")
    assert len(down.stderr.splitlines()) == 2 and "Traceback" not in down.output
