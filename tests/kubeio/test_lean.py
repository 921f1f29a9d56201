"""`kubeio.lean` through `kubeio.http.Http`: the kept connections of the JSON requests, against a
scripted server that answers exact bytes (keep-alive, chunks, a close, a cut-short or unparsable answer,
a silence), and over TLS with a self-signed certificate the client's configuration trusts or does not."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from kubernetes import client

from kubeio.errors import retry_after_of
from kubeio.http import ApiError, Http
from kubeio.lean import _usable
from tests.certs import self_signed
from tests.polling import wait_until

OK = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{"a": "ok"}'


class Scripted:
    """Answers each request with the next of `answers`; `None` closes the connection instead of answering,
    `b""` answers nothing (the client times out).  Records every request and counts connections."""

    def __init__(self, answers: list[bytes | None], tls: ssl.SSLContext | None = None) -> None:
        self.answers = list(answers)
        self.requests: list[bytes] = []
        self.connections = 0
        self.tls = tls
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            if self.tls is not None:
                try:
                    conn = self.tls.wrap_socket(conn, server_side=True)
                except (ssl.SSLError, OSError):
                    conn.close()
                    continue
            threading.Thread(target=self._talk, args=(conn,), daemon=True).start()

    def _talk(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while self.answers:
                while b"\r\n\r\n" not in data:
                    more = conn.recv(65536)
                    if not more:
                        return
                    data += more
                head, _, rest = data.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(rest) < length:
                    rest += conn.recv(65536)
                self.requests.append(head + b"\r\n\r\n" + rest[:length])
                data = rest[length:]
                answer = self.answers.pop(0)
                if answer is None:
                    return
                if answer == b"":
                    self.stop.wait(5)
                    return
                conn.sendall(answer)
                if b"Connection: close" in answer:
                    return

    def close(self) -> None:
        self.stop.set()
        self.listener.close()


_clients: list[client.ApiClient] = []


@pytest.fixture
def scripted() -> Iterator[list[Scripted]]:
    made: list[Scripted] = []
    yield made
    for api in _clients:
        api.close()  # type: ignore[no-untyped-call]  # its pool holds the kept connections
    _clients.clear()
    for s in made:
        s.close()


def http_to(server: Scripted, scheme: str = "http", **settings: object) -> Http:
    cfg = client.Configuration()
    cfg.host = f"{scheme}://127.0.0.1:{server.port}"
    cfg.api_key = {"authorization": "secret-token"}
    cfg.api_key_prefix = {"authorization": "Bearer"}
    for name, value in settings.items():
        setattr(cfg, name, value)
    api = client.ApiClient(cfg)
    api.user_agent = "lean-test"
    _clients.append(api)
    return Http(api, timeout=(2.0, 2.0))


def test_answers_on_one_kept_connection(scripted: list[Scripted]) -> None:
    server = Scripted([OK, OK, OK])
    scripted.append(server)
    h = http_to(server)
    for _ in range(2):
        assert h.json("GET", "/api/v1/nodes/a", what="get") == {"a": "ok"}
    assert h.json("PUT", "/api/v1/nodes/a", what="put", body={"x": 1}) == {"a": "ok"}
    assert server.connections == 1
    head, _, body = server.requests[2].partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"PUT /api/v1/nodes/a HTTP/1.1"
    assert f"Host: 127.0.0.1:{server.port}".encode() in lines
    assert b"authorization: Bearer secret-token" in lines  # the name as the client's auth_settings spell it
    assert b"User-Agent: lean-test" in lines
    assert b"Content-Type: application/json" in lines and b"Content-Length: 7" in lines
    assert orjson.loads(body) == {"x": 1}


def test_a_chunked_answer_is_put_together(scripted: list[Scripted]) -> None:
    chunked = b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{"a"\r\n6\r\n: [1]}\r\n0\r\n\r\n'
    server = Scripted([chunked, OK])
    scripted.append(server)
    h = http_to(server)
    assert h.json("GET", "/x", what="get") == {"a": [1]}
    assert h.json("GET", "/x", what="get") == {"a": "ok"}
    assert server.connections == 1


def test_connection_close_and_a_silently_closed_kept_connection_open_a_new_one(
    scripted: list[Scripted],
) -> None:
    closing = OK.replace(b"Content-Length", b"Connection: close\r\nContent-Length")
    server = Scripted([closing, OK, None, OK])
    scripted.append(server)
    h = http_to(server)
    assert h.json("GET", "/x", what="get") == {"a": "ok"}  # server said close: not kept
    assert h.json("GET", "/x", what="get") == {"a": "ok"}  # a second connection, kept
    # The server drops the kept connection without answering (`None`): the request fails with status 0
    # (no retry here, as with urllib3's retries=False), and the next one goes on a fresh connection.
    with pytest.raises(ApiError) as err:
        h.json("GET", "/x", what="get x")
    assert err.value.status == 0 and str(err.value).startswith("get x: ")
    assert h.json("GET", "/x", what="get") == {"a": "ok"}
    assert server.connections == 3


def test_a_kept_connection_the_server_closed_while_idle_is_not_reused(scripted: list[Scripted]) -> None:
    server = Scripted([OK, OK])
    scripted.append(server)
    h = http_to(server)
    assert h.json("GET", "/x", what="get") == {"a": "ok"}
    # Close the server's end of the kept connection from outside: its FIN reaches the client's socket.
    pool = h._host_pool()
    kept = pool.pool.queue[-1] if pool.pool is not None else None  # type: ignore[attr-defined]
    assert kept is not None and kept.sock is not None
    kept.sock.shutdown(socket.SHUT_WR)  # our side half-closed: the scripted server sees EOF and closes
    wait_until(lambda: not _usable(kept), 5.0, what="the closed connection seen")
    server.answers.append(OK)
    assert h.json("GET", "/x", what="get") == {"a": "ok"}
    assert server.connections == 2


def test_an_error_answer_keeps_status_reason_message_and_retry_after(scripted: list[Scripted]) -> None:
    status = orjson.dumps({"kind": "Status", "message": "too many\nrequests", "code": 429})
    answer = (
        b"HTTP/1.1 429 Too Many Requests\r\nretry-after: 3\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(status)}\r\n\r\n".encode()
        + status
    )
    server = Scripted([answer, OK])
    scripted.append(server)
    h = http_to(server)
    with pytest.raises(ApiError) as err:
        h.json("GET", "/x", what="get x")
    assert err.value.status == 429 and err.value.reason == "Too Many Requests"
    assert str(err.value) == "get x: HTTP 429: Too Many Requests (too many requests)"
    assert retry_after_of(err.value.headers) == 3.0 and err.value.body == status
    assert h.json("GET", "/x", what="get") == {"a": "ok"}
    assert server.connections == 1


@pytest.mark.parametrize(
    "answer",
    [
        b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\nConnection: close\r\n\r\n{"cut": ',  # cut short
        b"NOT HTTP AT ALL\r\n\r\n",  # unparsable
        b"",  # no answer: the read times out
    ],
    ids=["cut-short", "unparsable", "silence"],
)
def test_a_failed_exchange_is_status_zero_on_one_line(scripted: list[Scripted], answer: bytes) -> None:
    server = Scripted([answer, OK])
    scripted.append(server)
    cfg_timeout = (1.0, 0.3)
    h = http_to(server)
    with pytest.raises(ApiError) as err:
        h.json("GET", "/x", what="get x", timeout=cfg_timeout)
    assert err.value.status == 0 and str(err.value).startswith("get x: ") and "\n" not in str(err.value)
    assert h.json("GET", "/x", what="get") == {"a": "ok"}  # the broken connection was not kept
    assert server.connections == 2


def test_tls_uses_the_configurations_ca_and_refuses_an_untrusted_server(
    scripted: list[Scripted], tmp_path: Path
) -> None:
    pair = self_signed(tmp_path)
    if pair is None:
        pytest.skip("no openssl to make a certificate")
    cert, key = pair
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    server = Scripted([OK, OK], tls=tls)
    scripted.append(server)
    trusted = http_to(server, "https", ssl_ca_cert=str(cert))
    assert trusted.json("GET", "/x", what="get") == {"a": "ok"}
    assert trusted.json("GET", "/x", what="get") == {"a": "ok"}
    assert server.connections == 1
    untrusted = http_to(server, "https")  # the system's CAs only: the self-signed certificate is refused
    with pytest.raises(ApiError) as err:
        untrusted.json("GET", "/x", what="get x")
    assert err.value.status == 0 and "certificate" in str(err.value).lower()
