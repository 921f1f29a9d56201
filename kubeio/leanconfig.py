"""The Kubernetes configuration the components use, read without importing the `kubernetes` package.

Why it exists: `import kubernetes` costs each process ~23 MiB of RSS and ~0.2 s of CPU (its `__init__`
imports the whole generated client, every API and model, and `kubernetes.dynamic`), and of all of it the
components use the configuration loader, an ApiClient's urllib3 pool and its credentials: requests go
through `kubeio.http`.  The watcher and both leaders paid it (docs/benchmarks.md, "Cost by event rate").

What is read here: the in-cluster configuration (the service account's token, re-read as it rotates, and
CA; `KUBERNETES_SERVICE_HOST`/`PORT`), and a kubeconfig whose context's cluster and user use only
`server`, `certificate-authority[-data]`, `insecure-skip-tls-verify`, `tls-server-name`, `token`,
`tokenFile`, `client-certificate[-data]` and `client-key[-data]`.  Anything else (an exec plugin, an
auth-provider, a proxy, basic auth, a malformed file) returns None: `kubeio.client` then loads it with
the `kubernetes` client as before, with its messages.  The pool is built as the client builds it
(`kubernetes.client.rest`, with the client's defaults): certificate checks, CA, client certificate, SNI
name, `maxsize`, no retries.
"""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import urllib3

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REREAD_SECONDS = 60.0  # the kubernetes client re-reads an in-cluster token this often
CLUSTER_KEYS = frozenset(
    {
        "server",
        "certificate-authority",
        "certificate-authority-data",
        "insecure-skip-tls-verify",
        "tls-server-name",
    }
)
USER_KEYS = frozenset(
    {"token", "tokenFile", "client-certificate", "client-certificate-data", "client-key", "client-key-data"}
)


class NotLean(Exception):
    """The configuration needs the `kubernetes` client's loader."""


@dataclass
class LeanConfiguration:
    """What `kubeio.http` reads of a `kubernetes.client.Configuration`: the host and the credentials."""

    host: str
    verify_ssl: bool = True
    ssl_ca_cert: str | None = None  # a CA file
    cert_file: str | None = None
    key_file: str | None = None
    tls_server_name: str | None = None
    token: str | None = None
    token_file: str | None = None
    connection_pool_maxsize: int | None = None
    _read: tuple[float, str] | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def auth_settings(self) -> dict[str, dict[str, str]]:
        token = self._token()
        if not token:
            return {}
        return {"BearerToken": {"in": "header", "key": "authorization", "value": f"Bearer {token}"}}

    def _token(self) -> str | None:
        if self.token_file is None:
            return self.token
        with self._lock:
            now = time.monotonic()
            if self._read is None or now - self._read[0] >= TOKEN_REREAD_SECONDS:
                try:
                    self._read = (now, Path(self.token_file).read_text().strip())
                except OSError:
                    if self._read is None:
                        raise
            return self._read[1]


class _Rest:
    def __init__(self, pool_manager: urllib3.PoolManager) -> None:
        self.pool_manager = pool_manager


class LeanApiClient:
    """The part of `kubernetes.client.ApiClient` the components use: its configuration, its pool
    (`rest_client.pool_manager`), default headers, user agent, `close`."""

    def __init__(self, configuration: LeanConfiguration) -> None:
        self.configuration = configuration
        self.default_headers: dict[str, str] = {}
        self.user_agent = f"OpenAPI-Generator/{_client_version()}/python"  # the client's own default
        self.rest_client = _Rest(_pool_manager(configuration))

    def close(self) -> None:
        self.rest_client.pool_manager.clear()


def _client_version() -> str:
    try:
        return version("kubernetes")
    except PackageNotFoundError:
        return "0"


def _pool_manager(cfg: LeanConfiguration) -> urllib3.PoolManager:
    args: dict[str, Any] = {
        "cert_reqs": ssl.CERT_REQUIRED if cfg.verify_ssl else ssl.CERT_NONE,
        "ca_certs": cfg.ssl_ca_cert,
        "cert_file": cfg.cert_file,
        "key_file": cfg.key_file,
        "retries": False,
    }
    if cfg.tls_server_name:
        args["server_hostname"] = cfg.tls_server_name
    if cfg.connection_pool_maxsize is not None:
        args["maxsize"] = cfg.connection_pool_maxsize
    return urllib3.PoolManager(**args)


def incluster(sa_dir: Path = SA_DIR, env: Mapping[str, str] = os.environ) -> LeanConfiguration:
    """The pod's service account, as `kubernetes.config.load_incluster_config` reads it."""
    host, port = env.get("KUBERNETES_SERVICE_HOST", ""), env.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise NotLean("service host/port is not set")
    token, ca = sa_dir / "token", sa_dir / "ca.crt"
    if not token.is_file() or not token.read_text().strip() or not ca.is_file():
        raise NotLean("the service account's token or CA is missing")  # the client's loader says which
    if ":" in host:
        host = f"[{host}]"
    return LeanConfiguration(host=f"https://{host}:{port}", ssl_ca_cert=str(ca), token_file=str(token))


def from_kubeconfig(path: str | None, context: str | None) -> LeanConfiguration:
    """A kubeconfig's context (its `current-context` unless named), when it is plain enough (see the
    module's docstring); `NotLean` otherwise."""
    if path is None:
        path = os.environ.get("KUBECONFIG", "~/.kube/config")
        if os.pathsep in path:
            raise NotLean("KUBECONFIG names several files")
    file = Path(path).expanduser()
    # Imported here, not with the module: a component in a pod reads the in-cluster configuration and
    # never needs YAML (~1 MiB and ~10 ms of each process's start).
    import yaml  # noqa: PLC0415

    try:
        doc = yaml.safe_load(file.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise NotLean(str(exc)) from exc
    if not isinstance(doc, dict):
        raise NotLean("not a mapping")
    name = context or doc.get("current-context")
    ctx = _named(doc, "contexts", name, "context")
    cluster = _named(doc, "clusters", ctx.get("cluster"), "cluster")
    user = _named(doc, "users", ctx.get("user"), "user") if ctx.get("user") else {}
    if not set(cluster) <= CLUSTER_KEYS or not set(user) <= USER_KEYS:
        raise NotLean("needs the client's loader")  # exec, auth-provider, proxy-url, basic auth, …
    server = cluster.get("server")
    if not isinstance(server, str) or not server:
        raise NotLean("no server")
    base = file.parent
    cfg = LeanConfiguration(host=server.rstrip("/"))
    cfg.verify_ssl = not bool(cluster.get("insecure-skip-tls-verify"))
    cfg.tls_server_name = _text(cluster.get("tls-server-name"))
    cfg.ssl_ca_cert = _file(base, cluster, "certificate-authority")
    cfg.cert_file = _file(base, user, "client-certificate")
    cfg.key_file = _file(base, user, "client-key")
    cfg.token = _text(user.get("token"))
    token_file = _text(user.get("tokenFile"))
    if token_file is not None and cfg.token is None:
        cfg.token_file = str(base / token_file)
    return cfg


def _named(doc: dict[str, Any], section: str, name: object, key: str) -> dict[str, Any]:
    items = doc.get(section)
    if not isinstance(items, list) or not isinstance(name, str) or not name:
        raise NotLean(f"no {section}")
    for item in items:
        if isinstance(item, dict) and item.get("name") == name:
            body = item.get(key) or {}
            if not isinstance(body, dict):
                raise NotLean(f"{section}: {name} is not a mapping")
            return body
    raise NotLean(f"{section}: no {name}")


def _text(value: object) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise NotLean("not a string")
    return value


def _file(base: Path, section: Mapping[str, Any], key: str) -> str | None:
    """The file of `key`, or of `key-data` (base64) written to a temporary file, as the client does."""
    data = _text(section.get(f"{key}-data"))
    if data is not None:
        try:
            content = base64.standard_b64decode(data)
        except ValueError as exc:
            raise NotLean(str(exc)) from exc
        fd, name = tempfile.mkstemp(prefix="ipamgc-kube-")
        with os.fdopen(fd, "wb") as out:
            out.write(content)
        return name
    path = _text(section.get(key))
    if path is None:
        return None
    return str(base / path)
