"""Chunked transfer coding decoded in bulk (`kubeio.chunked`), and the watch stream that reads with it.

The decoder must give exactly the payload http.client would, however the wire bytes are cut into reads,
and refuse framing http.client would not read as chunks; `WatchStream` must read a real chunked answer
through it (not urllib3's per-chunk path) and yield the same events."""

from __future__ import annotations

import http.server
import os
import socket
import threading
from collections.abc import Iterator

import orjson
import pytest
import urllib3
from hypothesis import given
from hypothesis import strategies as st

from kubeio.chunked import MAX_SIZE_LINE, ChunkError, Dechunker
from kubeio.errors import KubeTransientError
from kubeio.watch import _QUIET_MAX, WatchStream, _raw_chunked_body, _receive_buffer, _SocketPace
from producer.kinds import Kind

payloads = st.lists(st.binary(min_size=1, max_size=300), max_size=12)


def wire(chunks: list[bytes], *, upper: bool = False, ext: bool = False) -> bytes:
    out = b""
    for c in chunks:
        size = f"{len(c):X}" if upper else f"{len(c):x}"
        out += size.encode() + (b";name=value" if ext else b"") + b"\r\n" + c + b"\r\n"
    return out + b"0\r\n\r\n"


def feed_in_pieces(data: bytes, cuts: list[int]) -> tuple[bytes, Dechunker]:
    d = Dechunker()
    got = b""
    at = 0
    for cut in [*sorted({min(c, len(data)) for c in cuts}), len(data)]:
        got += d.feed(data[at:cut])
        at = cut
    return got, d


@given(
    payloads, st.lists(st.integers(min_value=0, max_value=4000), max_size=40), st.booleans(), st.booleans()
)
def test_the_payload_is_what_was_chunked_however_the_bytes_arrive(
    chunks: list[bytes], cuts: list[int], upper: bool, ext: bool
) -> None:
    data = wire(chunks, upper=upper, ext=ext)
    got, d = feed_in_pieces(data, cuts)
    assert got == b"".join(chunks)
    assert d.done


@given(payloads, st.binary(max_size=50))
def test_nothing_after_the_last_chunk_is_read(chunks: list[bytes], trailer: bytes) -> None:
    d = Dechunker()
    assert d.feed(wire(chunks) + trailer) == b"".join(chunks)
    assert d.done
    assert d.feed(b"more") == b""


def test_an_unfinished_chunk_gives_what_it_has_and_waits_for_the_rest() -> None:
    d = Dechunker()
    assert d.feed(b"a\r\n01234") == b"01234"
    assert d.feed(b"56789") == b"56789"
    assert d.feed(b"\r") == b""
    assert d.feed(b"\n3\r") == b""
    assert d.feed(b"\nabc\r\n") == b"abc"
    assert not d.done


@pytest.mark.parametrize(
    "data",
    [
        b"zz\r\nabc\r\n",  # not hexadecimal
        b"0x3\r\nabc\r\n",  # a prefix int() would take
        b"+3\r\nabc\r\n",
        b"-3\r\nabc\r\n",
        b"1_0\r\n" + b"a" * 16 + b"\r\n",
        b"\r\nabc\r\n",  # no size
        b"3\r\nabcXY",  # data not followed by CRLF
        b"3\r\nabc\rX",
        b"1" * (MAX_SIZE_LINE + 1),  # a size line that never ends
        b"1" + b";" * MAX_SIZE_LINE + b"\r\n",
    ],
)
def test_malformed_framing_is_refused(data: bytes) -> None:
    with pytest.raises(ChunkError):
        Dechunker().feed(data)


# -- a watch answer over real HTTP -------------------------------------------------------------------------


def _events(n: int, pad: int = 0) -> list[bytes]:
    """`n` bookmarks, resourceVersion 0… (each `pad` bytes bigger: an IPAMBlock event is ~13 KB)."""
    meta = {"pad": "x" * pad} if pad else {}
    return [
        orjson.dumps({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": str(i), **meta}}})
        + b"\n"
        for i in range(n)
    ]


def _versions(ws: WatchStream) -> list[str]:
    """Every event's resourceVersion, the stream read to its end and closed."""
    try:
        return [e.resource_version for e in ws]
    finally:
        ws.close()


class _Chunked(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    body = b""  # the whole chunked body, written in the pieces below
    cuts: tuple[int, ...] = ()
    pace = 0.0  # seconds between two pieces (a stream whose events come one by one)
    done: threading.Event  # set when the test ends: a paced answer stops waiting

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        at = 0
        for cut in (*self.cuts, len(self.body)):
            self.wfile.write(self.body[at:cut])
            self.wfile.flush()
            at = cut
            if self.pace and self.done.wait(self.pace):
                return
        self.close_connection = True  # a body without its last chunk ends only when the connection does

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def serve() -> Iterator[type[_Chunked]]:
    handler = type("Handler", (_Chunked,), {"done": threading.Event()})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    handler.port = server.server_address[1]  # type: ignore[attr-defined]
    try:
        yield handler
    finally:
        handler.done.set()
        server.shutdown()
        server.server_close()


def _stream(handler: type[_Chunked], gulp: float = 0.0) -> WatchStream:
    pool = urllib3.HTTPConnectionPool("127.0.0.1", handler.port, retries=False)  # type: ignore[attr-defined]
    resp = pool.urlopen("GET", "/watch", preload_content=False, timeout=urllib3.Timeout(connect=5, read=10))
    return WatchStream(Kind.NODES, resp, gulp=gulp)


def test_a_watch_reads_its_events_off_the_socket_in_bulk(serve: type[_Chunked]) -> None:
    events = _events(40)
    # Chunks that split events and events that share chunks, written in pieces cut across the framing.
    stream_bytes = b"".join(events)
    chunks = [stream_bytes[i : i + 97] for i in range(0, len(stream_bytes), 97)]
    serve.body = wire(chunks)
    serve.cuts = (1, 5, 100, 101, 640, 641, 642, 2000)
    ws = _stream(serve)
    assert _raw_chunked_body(ws._resp) is not None  # the bulk path, not urllib3's
    assert _versions(ws) == [str(i) for i in range(40)]


def test_broken_framing_ends_the_watch_with_a_transient_error(serve: type[_Chunked]) -> None:
    serve.body = wire([_events(1)[0]])[:-7] + b"zz\r\n"
    ws = _stream(serve)
    try:
        with pytest.raises(KubeTransientError, match="CRLF"):
            list(ws)
    finally:
        ws.close()


def test_a_connection_closed_mid_stream_ends_the_watch(serve: type[_Chunked]) -> None:
    event = _events(1)[0]
    serve.body = b"%x\r\n" % len(event) + event + b"\r\n"  # no last chunk: the server just closes
    assert _versions(_stream(serve)) == ["0"]


# -- gulps: one wake-up per gulp for a quiet stream, none for a burst -----------------------------------


def _framed(events: list[bytes]) -> tuple[bytes, tuple[int, ...]]:
    """The chunked body of `events`, one chunk each, and the cuts between them (one write per event)."""
    body, cuts = b"", []
    for event in events:
        body += wire([event])[: -len(b"0\r\n\r\n")]
        cuts.append(len(body))
    return body + b"0\r\n\r\n", tuple(cuts)


def test_a_quiet_stream_is_read_once_per_gulp(serve: type[_Chunked]) -> None:
    # 24 events 20 ms apart, read in 0.1 s gulps.  After the read that follows a gulp, the socket is empty
    # and the stream sleeps at once: it used to read again first, blocked until the next event, and sleep
    # only then (two reads per gulp).
    events = _events(24)
    serve.body, serve.cuts = _framed(events)
    serve.pace = 0.02
    ws = _stream(serve, gulp=0.1)
    assert _versions(ws) == [str(i) for i in range(24)]
    assert ws.naps >= 2
    assert ws.reads <= ws.naps + 2, (ws.reads, ws.naps)


def test_a_burst_is_read_on_without_gulps(serve: type[_Chunked]) -> None:
    # 3.6 MB at once (300 IPAMBlock-sized events) through a gulping stream: every event, in order.  How many
    # gulps it takes depends on how fast the server's thread refills the socket on a busy machine (a read
    # that waited naps, as it should): the rule that reads on while the socket has more is asserted below
    # on a socket whose bytes are all there.  (It was asserted here as "at most one gulp", and a CI run on
    # a loaded machine saw three.)
    serve.body = wire(_events(300, pad=12_000))
    ws = _stream(serve, gulp=0.05)
    assert _versions(ws) == [str(i) for i in range(300)]


def test_the_pace_reads_on_while_the_socket_has_more_and_gulps_once_it_is_drained() -> None:
    a, b = socket.socketpair()
    with a, b:
        pace = _SocketPace(b.fileno())
        assert pace.quiet > 1000
        a.sendall(b"x" * 1000)
        assert not pace.nap(100, 0.0)  # more on the socket: read on, however little came since the gulp
        b.recv(1000)
        assert pace.nap(100, 0.0)  # drained, little since the gulp: a quiet stream sleeps
        assert pace.nap(100, 0.01)  # a read that had to wait sleeps too
        assert not pace.nap(pace.quiet, 0.0)  # a gulp's worth or more: a fast sender is read on, drained


def test_a_receive_buffer_that_cannot_be_told_leaves_no_descriptor_behind() -> None:
    # Not a socket (a pipe): the probe answers 0 (every read then reads on, as before the gulp rule) and
    # closes the duplicate it made; a socket answers what the kernel granted.
    r, w = os.pipe()
    try:
        before = len(os.listdir("/proc/self/fd"))
        assert _receive_buffer(r) == 0
        assert _SocketPace(r).quiet == 0
        assert len(os.listdir("/proc/self/fd")) == before
    finally:
        os.close(r)
        os.close(w)
    a, b = socket.socketpair()
    with a, b:
        assert _receive_buffer(a.fileno()) > 0
        assert 0 < _SocketPace(a.fileno()).quiet <= _QUIET_MAX
