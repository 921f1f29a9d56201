"""ipamgc's Redis clients (shared.config) speak RESP2 and never send CLIENT SETINFO: seen on the wire, through
a recording relay in front of the session's Redis, so the test holds on Redis 7.0 (which does not know the
command) as on Valkey and Redis >= 7.2 (which refuse it to ipamgc's ACL users, in their ACL log)."""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
from collections.abc import Iterator

import redis

from redisio.client import CLIENT_OPTIONS, redis_client
from tests.fixtures.redis import Endpoint


@contextlib.contextmanager
def recording_relay(upstream: Endpoint) -> Iterator[tuple[int, list[bytes]]]:
    """A loopback port that forwards every connection to `upstream`; yields it and what clients sent."""
    sent: list[bytes] = []
    listener = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()

    def pump(client: socket.socket) -> None:
        with client, socket.create_connection((upstream.host, upstream.port)) as server:
            sel = selectors.DefaultSelector()
            sel.register(client, selectors.EVENT_READ, server)
            sel.register(server, selectors.EVENT_READ, client)
            while not done.is_set():
                for key, _ in sel.select(timeout=0.1):
                    data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                    if not data:
                        return
                    if key.fileobj is client:
                        sent.append(data)
                    key.data.sendall(data)

    def accept() -> None:
        while not done.is_set():
            with contextlib.suppress(OSError):
                conn, _ = listener.accept()
                threading.Thread(target=pump, args=(conn,), daemon=True).start()

    listener.settimeout(0.1)
    threading.Thread(target=accept, daemon=True).start()
    try:
        yield listener.getsockname()[1], sent
    finally:
        done.set()
        listener.close()


def test_ipamgc_clients_send_no_client_setinfo(redis_endpoint: Endpoint) -> None:
    with recording_relay(redis_endpoint) as (port, sent):
        by_url = redis_client(f"redis://127.0.0.1:{port}/0", socket_timeout=5)
        by_host = redis.Redis(host="127.0.0.1", port=port, socket_timeout=5, **CLIENT_OPTIONS)
        for client in (by_url, by_host):
            assert client.ping()
            assert client.echo(b"x") == b"x"  # bytes replies
            client.close()
        wire = b"".join(sent).upper()
        assert b"PING" in wire and b"HELLO" not in wire  # RESP2: no HELLO 3 handshake
        assert b"SETINFO" not in wire

        # What the relay sees of redis-py's default, so the assertion above can fail.
        sent.clear()
        default = redis.Redis(host="127.0.0.1", port=port, protocol=2, socket_timeout=5)
        assert default.ping()
        default.close()
        assert b"SETINFO" in b"".join(sent).upper()
