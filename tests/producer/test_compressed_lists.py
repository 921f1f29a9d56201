"""List pages asked gzipped, as client-go asks (kube-apiserver compresses an answer of 128 KB and more for
a client that accepts it): over real HTTP, a gzipped page and a plain one give the watcher the same pods,
watches are asked plain, and a page that does not inflate is a transient error, never a short list."""

from __future__ import annotations

import copy
import gzip
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from kubeio.errors import KubeTransientError
from producer.kinds import Kind
from producer.kube import KubeApi, api_client
from tests.shared.test_fuzz_parsers import GOOD


def _pods(n: int) -> list[Any]:
    out = []
    for i in range(n):
        pod = copy.deepcopy(GOOD["Pod"])
        pod["metadata"]["name"] = f"pod-{i}"
        pod["metadata"]["uid"] = f"uid-{i}"
        out.append(pod)
    return out


class _Server(ThreadingHTTPServer):
    """Two pages of pods; gzipped when the request accepts it and `gzip` is on; `broken`: a gzipped page
    cut short."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.pods = _pods(5)
        self.gzip = True
        self.broken = False
        self.seen: list[tuple[str, str | None]] = []  # (query, Accept-Encoding) of each request


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, *_args: Any) -> None:
        pass

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        accepts = self.headers.get("Accept-Encoding")
        self.server.seen.append((url.query, accepts))
        if query.get("watch") == ["true"]:
            body = b""
        else:
            first = "continue" not in query
            items = self.server.pods[:3] if first else self.server.pods[3:]
            meta = {"resourceVersion": "42", **({"continue": "next"} if first else {})}
            page = {"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": items}
            body = json.dumps(page).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if self.server.gzip and accepts == "gzip" and body:
            body = gzip.compress(body, 1)
            if self.server.broken:
                body = body[: len(body) // 2] + b"\x00" * 16
            self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[_Server, KubeApi]]:
    srv = _Server()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{srv.server_address[1]}"}}],
        "users": [{"name": "u", "user": {}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    }
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps(config))
    try:
        yield srv, KubeApi(api_client(str(kubeconfig)), list_timeout=5.0)
    finally:
        srv.shutdown()
        srv.server_close()


def _read(api: KubeApi) -> list[tuple[str, str | None, str | None]]:
    got = []
    for page in api.pages(Kind.PODS, typed=True):
        got += [(p.name, p.node_name, p.phase) for p in page.items]
    return got


def test_a_gzipped_list_gives_the_pods_a_plain_one_gives(server: tuple[_Server, KubeApi]) -> None:
    srv, api = server
    gzipped = _read(api)
    srv.gzip = False
    plain = _read(api)
    assert gzipped == plain and [name for name, _, _ in plain] == [f"pod-{i}" for i in range(5)]
    items, rv = api.items(Kind.PODS)  # `ipamgc check`'s raw path too
    assert rv == "42" and [i["metadata"]["name"] for i in items] == [f"pod-{i}" for i in range(5)]


def test_lists_accept_gzip_and_watches_do_not(server: tuple[_Server, KubeApi]) -> None:
    srv, api = server
    _read(api)
    api.watch(Kind.PODS, "42").close()
    lists = [enc for query, enc in srv.seen if "watch=true" not in query]
    watches = [enc for query, enc in srv.seen if "watch=true" in query]
    assert lists == ["gzip", "gzip"] and watches and all(enc != "gzip" for enc in watches)


def test_a_page_that_does_not_inflate_is_a_transient_error(server: tuple[_Server, KubeApi]) -> None:
    srv, api = server
    srv.broken = True
    with pytest.raises(KubeTransientError, match="list pods: reading the body"):
        _read(api)
