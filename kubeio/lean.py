"""Kept connections for the small JSON requests (the leader's reads and conditional writes, every Lease
renewal): HTTP/1.1 written on a socket that urllib3 opened, the answer parsed by httptools (llhttp, the
parser of Node.js).

Why it exists: through urllib3's `urlopen`, one GET of a node from the API server cost 236–249 µs of the
client's CPU on these machines, against 97–125 µs through this module (three rounds of 300 each, against
`ipamgc sim serve`; 35–65 µs on a bare socket, without the pool's bookkeeping).  urllib3's response
object and http.client's header parsing (through the `email` package) were most of the difference.
The leader sends about eight requests per released IP, and each elected component renews its Lease
every retry period.

What stays urllib3's: the connections themselves, kept in the pool the kubernetes client configured and
closed with it, opened with its TLS, CA, client certificates, SNI and hostname checks.
Proxied configurations do not come here (`Http` keeps urllib3 for them), nor do watch and list streams.
What stays as `Http` had it: no retries (every retry is the caller's); a kept connection found closed
or readable before reuse is dropped, as urllib3 does (`is_connected`); any failure mid-exchange closes
the connection and is raised as `OSError` or `LeanError`, which `Http` reports as status 0.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import httptools
import urllib3

_READ_SIZE = 256 * 1024


class LeanError(Exception):
    """The exchange failed: the answer was cut short or could not be parsed."""


@dataclass(frozen=True, slots=True)
class Answer:
    """A complete answer: status, reason phrase, headers (names in title case: `Retry-After`), body."""

    status: int
    reason: str
    headers: dict[str, str]
    body: bytes


class _Reader:
    """httptools' callbacks: collects one answer."""

    __slots__ = ("done", "headers", "keep_alive", "parser", "parts", "reason")

    def __init__(self) -> None:
        self.reason = b""
        self.headers: dict[str, str] = {}
        self.parts: list[bytes] = []
        self.done = False
        self.keep_alive = False
        self.parser = httptools.HttpResponseParser(self)

    def on_status(self, status: bytes) -> None:
        self.reason += status

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").title()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self.parts.append(body)

    def on_message_complete(self) -> None:
        # Asked here: once the message is complete the parser is reset for the next one.
        self.keep_alive = self.parser.should_keep_alive()
        self.done = True


def _usable(conn: urllib3.connection.HTTPConnection) -> bool:
    """A kept connection still open with nothing arrived unasked (a server's close, stray bytes, or
    bytes TLS already decrypted)."""
    sock = conn.sock
    if sock is None:
        return False
    pending = getattr(sock, "pending", None)
    if pending is not None and pending():
        return False
    return bool(conn.is_connected)


def _exchange(
    sock: socket.socket, request: bytes, read_timeout: float, buf: bytearray
) -> tuple[Answer, bool]:
    """Send `request`, read its answer whole; (answer, whether the connection may be kept)."""
    sock.settimeout(read_timeout)
    sock.sendall(request)
    reader = _Reader()
    parser = reader.parser
    view = memoryview(buf)
    while not reader.done:
        n = sock.recv_into(buf)
        if not n:
            raise LeanError("the connection closed before the answer was complete")
        try:
            parser.feed_data(view[:n])
        except httptools.HttpParserError as exc:
            raise LeanError(f"unparsable answer: {exc}") from exc
    answer = Answer(
        parser.get_status_code(), reader.reason.decode("latin-1"), reader.headers, b"".join(reader.parts)
    )
    return answer, reader.keep_alive


class LeanConnections:
    """Requests with complete answers on connections of the pool `pool_of` returns (the ApiClient's, so
    they are closed with it): a request takes one (`_get_conn`, which drops one the server closed and
    opens one with the pool's settings when none is idle), opens it if it is not, and puts it back; back
    closed (a slot for a new one, as urllib3 does) after a failure or an answer without keep-alive."""

    def __init__(self, pool_of: Callable[[], urllib3.HTTPConnectionPool], host: str) -> None:
        self._pool_of = pool_of
        self._host = host  # the Host header
        self._local = threading.local()  # a read buffer per thread

    def exchange(
        self,
        method: str,
        target: str,
        headers: dict[str, str],
        body: bytes | None,
        timeout: tuple[float, float],
    ) -> Answer:
        """Send one request, return its answer (any status).  `OSError`, `LeanError` or urllib3's
        `HTTPError` (a closed pool, no connection) on failure."""
        lines = [f"{method} {target} HTTP/1.1\r\nHost: {self._host}\r\n"]
        lines.extend(f"{name}: {value}\r\n" for name, value in headers.items())
        if body is not None:
            lines.append(f"Content-Length: {len(body)}\r\n")
        lines.append("\r\n")
        request = "".join(lines).encode("latin-1")
        if body is not None:
            request += body
        buf = getattr(self._local, "buf", None)
        if buf is None:
            buf = self._local.buf = bytearray(_READ_SIZE)
        pool = self._pool_of()
        conn = cast(urllib3.connection.HTTPConnection | None, pool._get_conn())
        try:
            assert conn is not None
            if conn.sock is not None and not _usable(conn):
                conn.close()
            if conn.sock is None:
                conn.timeout = timeout[0]
                conn.connect()
            assert conn.sock is not None
            answer, keep = _exchange(conn.sock, request, timeout[1], buf)
        except BaseException:
            if conn is not None:
                conn.close()
            pool._put_conn(conn)
            raise
        if not keep:
            conn.close()
        pool._put_conn(conn)
        return answer
