"""Raw JSON requests to the API server, over the official client's configuration and connection pool.

The generated API methods of the `kubernetes` client cost ~70 µs of CPU per call over the HTTP exchange
itself (pydantic argument validation, parameter sanitising, a stdlib `json.dumps` of every body, URL
re-parsing), which the leader pays on every read and conditional write of a release and both elected
components pay on every Lease renewal (docs/benchmarks-history.md).  Here a request is one `urlopen` on the
ApiClient's own urllib3 pool: the TLS settings, client certificates and proxy stay the client's, the
bearer token comes from `Configuration.auth_settings()` on each request (so a rotated in-cluster token or
an exec plugin's refresh is honoured as the generated methods honour it), bodies are orjson bytes.
The credentials are read through `auth_settings()` at most once every `CREDENTIALS_REUSE_SECONDS` (10 s)
and again at once after a 401: the client's refresh hook re-applies the whole kubeconfig (or in-cluster
config) on every call, host setter and proxy-environment scan included, which was 11 % of the leader's CPU
against a real kube-apiserver with a bearer token (docs/benchmarks.md); client-go re-reads a rotated
in-cluster token once a minute, so a token is never used for longer than it would be there.
Requests whose answer is read whole (`request`, `json`) go on kept connections that the pool opened, written
and parsed without urllib3's response machinery (`kubeio.lean`, about half the CPU per request); proxied
configurations and streams stay on `urlopen`.
The watcher lists and watches through `stream` (a body read by the caller: a list page, a watch), so
its process never imports the generated API classes (`CoreV1Api`: 0.37 s and ~20 MiB).
Every request is counted and timed as client-go counts its (`kubeio/requestmetrics.py`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, TypedDict, Unpack
from urllib.parse import quote, urlencode, urlsplit

import orjson
import urllib3

from kubeio.client import ApiClient
from kubeio.lean import LeanConnections, LeanError
from kubeio.requestmetrics import PROCESS, RequestStats

JsonObj = dict[str, Any]


class ApiError(Exception):
    """A non-2xx answer (`status`) or no usable answer at all (`status` 0); `str()` is one line.
    `body` and `headers` are the answer's (empty without one): a caller reads a Status document's
    details or a Retry-After from them."""

    def __init__(
        self,
        status: int,
        message: str,
        reason: str = "",
        *,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.body = body
        self.headers: dict[str, str] = dict(headers) if headers is not None else {}


def path_part(name: str) -> str:
    """One path segment, percent-encoded as the generated client encodes path parameters."""
    return quote(name, safe="")


class RequestOptions(TypedDict, total=False):
    """The keyword arguments of `Http.request` and `Http.stream`: a query, a JSON body and its content
    type, (connect, read) timeouts."""

    query: Mapping[str, str] | None
    body: JsonObj | None
    content_type: str
    timeout: tuple[float, float] | None


#: How long the headers `auth_settings()` gave are reused before it runs again (a 401 ends it at once).
CREDENTIALS_REUSE_SECONDS = 10.0


class Http:
    """Requests on one ApiClient's configuration and pool; thread-safe as urllib3's pools are."""

    def __init__(
        self,
        api: ApiClient,
        *,
        timeout: tuple[float, float] = (10.0, 30.0),
        clock: Callable[[], float] = time.monotonic,
        stats: RequestStats = PROCESS,
    ) -> None:
        cfg = api.configuration
        self._stats = stats
        self._cfg = cfg
        self._clock = clock
        self._credentials: tuple[float, dict[str, str]] | None = None  # (read at, headers)
        host = cfg.host.rstrip("/")
        self._prefix = urlsplit(host).path  # an API server behind a path (a proxy's /k8s/clusters/x)
        manager = api.rest_client.pool_manager
        # A proxy manager needs absolute URLs; a direct pool takes paths.
        self._proxied = isinstance(manager, urllib3.ProxyManager)
        self._manager = manager
        self._pool: urllib3.HTTPConnectionPool | None = None  # the host's pool, looked up once
        self._host = host
        self._timeout = urllib3.Timeout(connect=timeout[0], read=timeout[1])
        self._headers = {"Accept": "application/json", **api.default_headers}
        if api.user_agent:
            self._headers["User-Agent"] = api.user_agent
        self._timeouts = timeout
        self._lean = None if self._proxied else LeanConnections(self._host_pool, urlsplit(host).netloc)

    def _host_pool(self) -> urllib3.HTTPConnectionPool:
        """The host's pool, looked up once, and again once the manager has closed it (`pool` is None)."""
        pool = self._pool
        if pool is None or pool.pool is None:
            pool = self._pool = self._manager.connection_from_url(self._host)
        return pool

    def _auth(self) -> dict[str, str]:
        """The request headers with the credentials: a copy, the caller may add to it."""
        now = self._clock()
        held = self._credentials
        if held is not None and now - held[0] < CREDENTIALS_REUSE_SECONDS:
            return dict(held[1])
        headers = dict(self._headers)
        for setting in self._cfg.auth_settings().values():
            if setting.get("in") == "header" and setting.get("value"):
                headers[setting["key"]] = setting["value"]
        self._credentials = (now, headers)
        return dict(headers)

    def _refused(self, status: int) -> None:
        """A 401: the credentials are read afresh for the next request (a token rotated under us)."""
        if status == 401:
            self._credentials = None

    def request(self, method: str, path: str, *, what: str, **options: Unpack[RequestOptions]) -> bytes:
        """The answer's body; `ApiError` for a non-2xx status or a failed exchange."""
        if self._lean is not None:
            return self._lean_request(method, path, what=what, **options)
        resp = self.stream(method, path, what=what, **options)
        try:
            return resp.read()
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ApiError(0, f"{what}: unreadable answer: {exc}") from exc
        finally:
            resp.release_conn()

    def _lean_request(self, method: str, path: str, *, what: str, **options: Unpack[RequestOptions]) -> bytes:
        assert self._lean is not None
        query_part, headers, data = self._prepared(options)
        timeout = options.get("timeout") or self._timeouts
        started = time.perf_counter()
        try:
            answer = self._lean.exchange(method, self._prefix + path + query_part, headers, data, timeout)
        except (OSError, LeanError, urllib3.exceptions.HTTPError) as exc:
            self._stats.record(method, path, 0, time.perf_counter() - started)
            raise ApiError(0, f"{what}: {type(exc).__name__}: {exc}") from exc
        self._stats.record(method, path, answer.status, time.perf_counter() - started)
        if 200 <= answer.status <= 299:
            return answer.body
        self._refused(answer.status)
        raise _status_error(what, answer.status, answer.reason, answer.body, answer.headers)

    def _prepared(self, options: RequestOptions) -> tuple[str, dict[str, str], bytes | None]:
        """A request's query string ("" or "?…"), headers (credentials read now) and body bytes."""
        query = options.get("query")
        headers = self._auth()
        body = options.get("body")
        data = None
        if body is not None:
            data = orjson.dumps(body)
            headers["Content-Type"] = options.get("content_type", "application/json")
        return ("?" + urlencode(query) if query else ""), headers, data

    def stream(
        self, method: str, path: str, *, what: str, **options: Unpack[RequestOptions]
    ) -> urllib3.BaseHTTPResponse:
        """A 2xx answer with its body not read yet (a watch, a list page): the caller reads it and
        releases the connection.  `ApiError` for a non-2xx status (its body read) or a failed exchange."""
        query_part, headers, data = self._prepared(options)
        timeout = options.get("timeout")
        t = self._timeout if timeout is None else urllib3.Timeout(connect=timeout[0], read=timeout[1])
        query = options.get("query")
        verb = "WATCH" if query and query.get("watch") in ("true", "1") else method
        started = time.perf_counter()
        try:
            if not self._proxied:
                resp = self._direct(method, self._prefix + path + query_part, data, headers, t)
            else:
                resp = self._manager.urlopen(
                    method, self._host + path + query_part, body=data, headers=headers,
                    retries=False, redirect=False, timeout=t, preload_content=False,
                )  # fmt: skip
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            self._stats.record(verb, path, 0, time.perf_counter() - started)
            raise ApiError(0, f"{what}: {type(exc).__name__}: {exc}") from exc
        status = int(resp.status)
        self._stats.record(verb, path, status, time.perf_counter() - started)
        if 200 <= status <= 299:
            return resp
        self._refused(status)
        try:
            payload = resp.read()
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ApiError(0, f"{what}: unreadable answer: {exc}") from exc
        finally:
            resp.release_conn()
        raise _status_error(what, status, str(resp.reason or ""), payload, resp.headers)

    def _direct(
        self, method: str, url: str, data: bytes | None, headers: dict[str, str], t: urllib3.Timeout
    ) -> urllib3.BaseHTTPResponse:
        """`urlopen` on the host's pool.  The pool is looked up once, not per request (parsing the URL
        and building the pool key was ~30 µs of each of the leader's requests); a pool closed since (the
        manager evicts and closes pools) answers `ClosedPoolError` before sending anything, and the
        request goes to the pool looked up afresh."""

        def urlopen(pool: urllib3.HTTPConnectionPool) -> urllib3.BaseHTTPResponse:
            return pool.urlopen(
                method, url, body=data, headers=headers, retries=False, redirect=False, timeout=t,
                preload_content=False, assert_same_host=False,
            )  # fmt: skip

        if self._pool is not None:
            try:
                return urlopen(self._pool)
            except urllib3.exceptions.ClosedPoolError:
                pass
        self._pool = self._manager.connection_from_url(self._host)
        return urlopen(self._pool)

    def json(self, method: str, path: str, *, what: str, **kwargs: Any) -> JsonObj:
        """`request`, its answer decoded: an object, else `ApiError` (status 0)."""
        payload = self.request(method, path, what=what, **kwargs)
        try:
            doc = orjson.loads(payload)
        except orjson.JSONDecodeError as exc:
            raise ApiError(0, f"{what}: unreadable answer: {exc}") from exc
        if not isinstance(doc, dict):
            raise ApiError(0, f"{what}: the answer is not an object")
        return doc


def _status_error(
    what: str, status: int, reason: str, payload: bytes, headers: Mapping[str, str]
) -> ApiError:
    detail = _status_message(payload)
    message = f"{what}: HTTP {status}: {reason}" + (f" ({detail})" if detail else "")
    return ApiError(status, message, reason, body=payload, headers=headers)


def _status_message(payload: bytes) -> str:
    """A Status document's `message`, on one line ('' if the body is not one)."""
    try:
        doc = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return ""
    message = doc.get("message") if isinstance(doc, dict) else None
    return " ".join(message.split()) if isinstance(message, str) else ""
