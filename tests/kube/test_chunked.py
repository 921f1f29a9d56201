"""`kubeio.chunked`: a chunked body de-framed from whatever pieces the socket delivers, exactly as sent."""

from __future__ import annotations

import io
import itertools
import socket
import threading

import pytest
import urllib3
from hypothesis import given, settings
from hypothesis import strategies as st
from urllib3.exceptions import ProtocolError

from kubeio.chunked import ChunkedBody, body_of


class _Pieces(io.RawIOBase):
    """A raw stream that hands out `pieces` one per read, as a socket hands out what arrived."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = list(pieces)

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray) -> int:  # type: ignore[override]
        if not self.pieces:
            return 0
        piece = self.pieces.pop(0)
        n = min(len(b), len(piece))
        b[:n] = piece[:n]
        if n < len(piece):
            self.pieces.insert(0, piece[n:])
        return n


def _frame(chunks: list[bytes], trailer: bytes = b"") -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks if c)
    return body + b"0\r\n" + trailer + b"\r\n"


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points) if b > a]


def _read_all(body: ChunkedBody) -> bytes:
    out = b""
    while (data := body.read()) is not None:
        assert data  # never an empty read: a read of framing only reads on
        out += data
    return out


@settings(max_examples=300, deadline=None)
@given(
    chunks=st.lists(st.binary(min_size=0, max_size=300), max_size=12),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=20),
    trailer=st.sampled_from([b"", b"X-Trailer: 1\r\n"]),
    ext=st.booleans(),
)
def test_any_split_of_a_chunked_body_reads_back_exactly_its_data(
    chunks: list[bytes], cuts: list[int], trailer: bytes, ext: bool
) -> None:
    framed = _frame(chunks, trailer)
    if ext:
        framed = framed.replace(b"\r\n", b";name=value\r\n", 1) if chunks and chunks[0] else framed
    body = ChunkedBody(io.BufferedReader(_Pieces(_split(framed, cuts)), buffer_size=64))
    assert _read_all(body) == b"".join(chunks)
    assert body.read() is None


def test_events_that_arrived_together_come_out_of_one_read() -> None:
    events = [b'{"type":"ADDED"}\n', b'{"type":"MODIFIED"}\n', b'{"type":"DELETED"}\n']
    framed = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events)
    body = ChunkedBody(io.BufferedReader(_Pieces([framed, b"0\r\n\r\n"])))
    assert body.read() == b"".join(events)
    assert body.read() is None


@pytest.mark.parametrize(
    ("framed", "why"),
    [
        (b"zz\r\nabc\r\n0\r\n\r\n", "bad chunk size"),
        (b"3\r\nabcXY0\r\n\r\n", "not followed by CRLF"),
        (b"5\r\nab", "ended in the middle"),
        (b"-3\r\nabc\r\n", "bad chunk size"),
        (b"1" * 5000, "too long"),
    ],
)
def test_a_broken_frame_is_a_protocol_error(framed: bytes, why: str) -> None:
    body = ChunkedBody(io.BufferedReader(_Pieces([framed])))
    with pytest.raises(ProtocolError, match=why):
        _read_all(body)


def test_body_of_reads_a_real_chunked_response_and_declines_others() -> None:
    """Over a real socket and urllib3: a chunked body is read through; a Content-Length body, or a
    content-encoded one, is left to urllib3 (None)."""
    replies = [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Encoding: gzip\r\n\r\n0\r\n\r\n",
    ]
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def serve() -> None:
        for reply in replies:
            conn, _ = server.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(reply)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        http = urllib3.PoolManager()
        resp = http.request("GET", f"http://127.0.0.1:{port}/", preload_content=False, retries=False)
        body = body_of(resp)
        assert body is not None
        assert _read_all(body) == b"hello world"
        resp.close()
        for _ in replies[1:]:
            resp = http.request("GET", f"http://127.0.0.1:{port}/", preload_content=False, retries=False)
            assert body_of(resp) is None
            resp.close()
    finally:
        t.join(timeout=5)
        server.close()
