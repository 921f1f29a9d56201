"""A watch answer read as events, and the list/watch plumbing around it (pages, back-off).

Why it exists: a watch is one long chunked HTTP body, and how it is read decides what a watch event costs
(docs/benchmarks-history.md).  `WatchStream` takes whatever the socket has buffered in one read, decodes its
chunked framing in bulk (`kubeio.chunked`), splits it into lines and turns each line into a `WatchEvent`:
through the caller's `fast` decoder when it knows the kind (the watcher's msgspec structs for pods and
IPAMBlocks, `producer/typed.py`), else through orjson.  An `ERROR` event becomes the `kubeio.errors`
error its status is (410: `ResourceExpired`, relist), a broken stream a `KubeTransientError`.
`Backoff` is the full-jitter back-off every retry loop of the edge's callers uses.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import os
import random
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import urllib3

from kubeio.chunked import ChunkError, Dechunker
from kubeio.errors import KubeTransientError, classify_status, translate

# -- full-jitter back-off --------------------------------------------------------------------------


class Backoff:
    """Full jitter (AWS architecture blog): uniform(0, min(cap, base · 2^attempt)) seconds."""

    def __init__(self, base: float, cap: float, rng: Callable[[], float] = random.random) -> None:
        self.base = base
        self.cap = cap
        self.rng = rng
        self.attempt = 0

    def next(self, retry_after: float | None = None) -> float:
        ceiling = min(self.cap, self.base * 2.0 ** min(self.attempt, 32))
        self.attempt += 1
        return max(self.rng() * ceiling, retry_after or 0.0)

    def reset(self) -> None:
        self.attempt = 0


# -- the API ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Page:
    items: list[Any]  # raw JSON objects, their bytes (decoded by the caller's fast path), or typed objects
    resource_version: str  # of the list snapshot (every page of one list carries the same)
    last: bool


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: str  # ADDED, MODIFIED, DELETED, BOOKMARK
    object: dict[str, Any]
    resource_version: str
    typed: Any = None  # already typed by the caller's fast decoder (`object` is then empty)


# A read that waited at least this long for the server found nothing buffered: the thread was asleep.
_BLOCKED_SECONDS = 0.001
# The most a watch thread takes from the socket in one read (a /26 IPAMBlock event is ~13 KB).
_READ_SIZE = 256 * 1024


def _raw_chunked_body(resp: urllib3.BaseHTTPResponse) -> io.BufferedIOBase | None:
    """The buffered socket under a chunked response of which nothing has been read yet, else None.

    urllib3 2 keeps http.client's response as `_fp` (private, so every assumption is checked here and any
    other shape falls back to urllib3's own reading): `chunked`, `chunk_left` still None (no chunk read),
    `fp` the socket's buffered reader.  A body with a content coding is left to urllib3 too."""
    fp = getattr(resp, "_fp", None)
    if not isinstance(fp, http.client.HTTPResponse) or not fp.chunked or fp.chunk_left is not None:
        return None
    raw = fp.fp
    if not isinstance(raw, io.BufferedReader):
        return None
    if resp.headers.get("content-encoding", "identity").lower() != "identity":
        return None
    return raw


class _WaitedPace:
    """When a stream read through urllib3 takes a gulp: after a read that had to wait for the server."""

    def nap(self, _size: int, waited: float) -> bool:
        return waited >= _BLOCKED_SECONDS


class _SocketPace:
    """When a stream read off its socket in bulk takes a gulp (`WatchStream`): after a read that had to
    wait for the server, or once what the stream has read since its last gulp is less than `quiet` bytes
    and the socket has nothing more right now.

    After a read, `read1` holds nothing of its own (it hands over its buffer, or reads the socket straight
    into the result), so a poll of the socket tells whether more has arrived.  A quiet stream thus wakes
    once per gulp: before, the read after a gulp was followed by a read blocked until the next event, and
    only then by the sleep, two wake-ups (docs/benchmarks-history.md, "After the leader's gate and the quiet
    gulps": the watch threads' reads halved; per process the change was below what the benchmark
    resolves).  A stream that
    brought `quiet` bytes or more since its last gulp reads on as before (blocking until the next event):
    a sender faster than `quiet` per gulp is never held to what fits the socket's buffer per gulp, however
    its bytes come (a TLS read returns one record, at most 16 KiB).  `quiet` is a quarter of the socket's
    receive buffer (asked for at `RECEIVE_BUFFER`; the kernel caps it at `net.core.rmem_max`), at most
    `_QUIET_MAX`: what a gulp brings at most stays well within what the socket holds."""

    def __init__(self, fd: int) -> None:
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)
        self.quiet = min(_QUIET_MAX, _receive_buffer(fd) // 4)
        self._since_nap = 0

    def nap(self, size: int, waited: float) -> bool:
        self._since_nap += size
        if waited >= _BLOCKED_SECONDS or (self._since_nap < self.quiet and not self._poll.poll(0)):
            self._since_nap = 0
            return True
        return False


# The receive buffer a watch socket asks for (Linux reports twice what it grants), and the most a quiet
# stream's gulp may bring: a /26 IPAMBlock event is ~13 KB, so ~20 block events per gulp still count as
# quiet (a 10k-pod cluster at 50 pod events/s brings ~160 KB per 0.25 s gulp).
RECEIVE_BUFFER = 1 << 20
_QUIET_MAX = 256 * 1024


def _receive_buffer(fd: int) -> int:
    """The socket's receive buffer after asking for `RECEIVE_BUFFER` (0 if it cannot be told: every read
    then reads on as before)."""
    try:
        dup = os.dup(fd)
    except OSError:
        return 0
    try:
        sock = socket.socket(fileno=dup)  # the same socket (its options are the original's); closed below
    except OSError:
        os.close(dup)
        return 0
    with sock:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
        try:
            return int(sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF))
        except OSError:
            return 0


class WatchStream:
    """One watch response, iterated as events; `abort()` from another thread ends it at once.

    Read in gulps (`gulp` seconds, `KubeApi`'s default 0.25): once a read has left nothing on the socket,
    the thread sleeps for `gulp` before it reads on, so that what arrives meanwhile is read in one go from
    the socket's buffer, not with a thread wake-up per event (measured: ~60 µs of CPU per event woken, ~10
    µs read in gulps).  While the socket has more (a burst, or a body bigger than one read) it reads on
    without sleeping (`_SocketPace`), so a burst is not held back by gulps.  Events are at most `gulp`
    later; the watcher's batches wait 1 s anyway.

    `reads` and `naps` count the reads and the gulps slept (what a quiet stream's CPU follows)."""

    def __init__(
        self,
        kind: str,
        resp: urllib3.BaseHTTPResponse,
        *,
        gulp: float = 0.0,
        fast: Callable[[bytes], WatchEvent | None] | None = None,
    ) -> None:
        self.kind = kind
        self._fast = fast
        self._resp = resp
        self._aborted = False
        self._gulp = gulp
        self._interrupted = threading.Event()
        self.reads = 0
        self.naps = 0

    def _chunks(self) -> Iterator[bytes]:
        raw = _raw_chunked_body(self._resp)
        pace: _WaitedPace | _SocketPace
        if raw is None:  # not a fresh chunked body over http.client: urllib3 decodes it, a chunk at a time
            chunks = self._resp.stream(amt=None, decode_content=False)
            read: Callable[[], bytes | None] = lambda: next(chunks, None)  # noqa: E731
            pace = _WaitedPace()
        else:
            # Whatever the socket has buffered, in one read, its chunked framing decoded in bulk
            # (`kubeio.chunked`: 38–40 µs per IPAMBlock event to read and frame, 47–48 through urllib3).
            dechunker = Dechunker()

            def read() -> bytes | None:
                while not dechunker.done:
                    data = raw.read1(_READ_SIZE)
                    if not data:
                        return None  # the server closed the connection
                    body = dechunker.feed(data)
                    if body:
                        return body
                return None

            pace = _SocketPace(raw.fileno())

        while True:
            before = time.monotonic()
            chunk = read()
            waited = time.monotonic() - before
            if chunk is None:
                return
            self.reads += 1
            yield chunk
            if self._gulp and not self._aborted and pace.nap(len(chunk), waited):
                self.naps += 1
                self._interrupted.wait(self._gulp)

    def __iter__(self) -> Iterator[WatchEvent]:
        buf = bytearray()
        try:
            for chunk in self._chunks():
                buf += chunk
                start = 0
                while (end := buf.find(b"\n", start)) >= 0:
                    line = bytes(buf[start:end])
                    start = end + 1
                    if line.strip():
                        yield self._event(line)
                del buf[:start]
            if bytes(buf).strip():
                yield self._event(bytes(buf))
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            if self._aborted:
                return
            raise translate(exc, f"watch {self.kind}") from exc
        except ChunkError as exc:
            if self._aborted:
                return
            raise KubeTransientError(f"watch {self.kind}: {exc}") from exc

    def _event(self, line: bytes) -> WatchEvent:
        fast = self._fast(line) if self._fast is not None else None
        if fast is not None:
            return fast
        try:
            raw = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise KubeTransientError(f"watch {self.kind}: unreadable event: {exc}") from exc
        etype = raw.get("type") if isinstance(raw, dict) else None
        obj = raw.get("object") if isinstance(raw, dict) else None
        if not isinstance(etype, str) or not isinstance(obj, dict):
            raise KubeTransientError(f"watch {self.kind}: event without type or object")
        if etype == "ERROR":
            code = obj.get("code")
            status = code if isinstance(code, int) else 500
            raise classify_status(status, f"watch {self.kind}: {obj.get('message', 'error event')}")
        meta = obj.get("metadata")
        rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
        return WatchEvent(etype, obj, rv if isinstance(rv, str) else "")

    def abort(self) -> None:
        """Interrupt a read blocked in another thread (the socket is shut down)."""
        self._aborted = True
        self._interrupted.set()
        # ValueError: urllib3 has no socket to shut down any more (the stream ended and its connection
        # was released meanwhile): nothing is blocked on it.  Seen as a crash of the watcher's thread
        # when it stopped (tests/deploy/test_rbac.py failed on it in three of eight runs in a session).
        with contextlib.suppress(OSError, AttributeError, ValueError):
            self._resp.shutdown()

    def close(self) -> None:
        self._resp.close()
        self._resp.release_conn()
