"""A redis-server of the run's own, so that a run may kill it and bring it back empty on the same port
(also the security tests' Redis with TLS or ACLs).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import redis

from ipamgc import childproc
from ipamgc.local_redis import SERVER_ARGS, redis_server_binary
from redisio.client import redis_client

log = logging.getLogger(__name__)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True, slots=True)
class Tls:
    """PEM files for a TLS-only server (`--tls-port`, plain port off); the CA verifies the server."""

    cert: Path
    key: Path
    ca: Path


class RedisProcess:
    """A redis-server on a loopback port that can be killed and brought back empty on the same port;
    optionally with a password (`requirepass`) and TLS only."""

    def __init__(
        self,
        log_file: Path,
        port: int | None = None,
        *,
        password: str | None = None,
        tls: Tls | None = None,
        args: tuple[str, ...] = (),
    ) -> None:
        self.binary = redis_server_binary()
        self.args = args  # more server arguments (`--dir`, `--replicaof` of a Sentinel topology's servers)
        self.port = port or free_port()
        self.password = password
        self.tls = tls
        self.log_file = log_file
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        if self.tls is None:
            return f"redis://{auth}127.0.0.1:{self.port}/0"
        return f"rediss://{auth}127.0.0.1:{self.port}/0?ssl_cert_reqs=required&ssl_ca_certs={self.tls.ca}"

    def start(self, timeout: float = 10.0) -> None:
        args = [self.binary, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", *SERVER_ARGS]
        if self.tls is None:
            args += ["--port", str(self.port)]
        else:
            t = self.tls
            args += ["--port", "0", "--tls-port", str(self.port), "--tls-auth-clients", "no"]
            args += [
                "--tls-cert-file",
                str(t.cert),
                "--tls-key-file",
                str(t.key),
                "--tls-ca-cert-file",
                str(t.ca),
            ]
        if self.password:
            args += ["--requirepass", self.password]
        args += self.args
        with self.log_file.open("ab") as out:
            self.proc = childproc.popen(args, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        client = redis_client(self.url, socket_connect_timeout=0.5)
        try:
            while True:
                with contextlib.suppress(redis.ConnectionError):
                    if client.ping():
                        return
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.kill()
                    raise RuntimeError(
                        f"redis-server did not start on port {self.port} (see {self.log_file})"
                    )
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=0.02)  # the poll interval; notices a server that died
        finally:
            client.close()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait(timeout=10)

    def restart_empty(self, down: float = 0.0, stop: threading.Event | None = None) -> None:
        """SIGKILL (nothing is saved) and start again on the same port after `down` seconds."""
        self.kill()
        if down > 0:
            (stop or threading.Event()).wait(down)
        self.start()
        self.restarts += 1

    def snapshot(self) -> dict[bytes, tuple[bytes, int]]:
        """Every key as `DUMP` serializes it, with its TTL (ms, 0: none): what `rollback` puts back."""
        client = redis_client(self.url)
        try:
            out: dict[bytes, tuple[bytes, int]] = {}
            for key in client.scan_iter(count=1000):
                value, ttl = client.dump(key), client.pttl(key)
                if isinstance(value, bytes):
                    out[key] = (value, max(0, int(ttl)))
            return out
        finally:
            client.close()

    def rollback(self, snapshot: dict[bytes, tuple[bytes, int]]) -> int:
        """Redis as it was at `snapshot`, in one transaction (no client sees it empty): what a failover to
        a replica that missed the last writes, or a restart from an older AOF, leaves.  Returns the keys."""
        client = redis_client(self.url)
        # A `redis-maxmemory` window may be open: the restore is the fault's, not a write it refuses.
        limit = str(client.config_get("maxmemory").get("maxmemory") or "0")
        try:
            client.config_set("maxmemory", 0)
            pipe = client.pipeline(transaction=True)
            pipe.flushall()
            for key, (value, ttl) in snapshot.items():
                pipe.restore(key, ttl, value, replace=True)
            pipe.execute()
            return len(snapshot)
        finally:
            client.config_set("maxmemory", limit)
            client.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
