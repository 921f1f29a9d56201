"""A redis-server of the test's own that loads an ACL file (`--aclfile`), plus an `admin` user the test
reads the ACL log with.  Used by the ACL tests here and by tests/deploy (the compose and deploy wiring)."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis

from ipamgc.local_redis import redis_server_binary
from lab.chaos import free_port
from redisio.client import CLIENT_OPTIONS
from shared.acl import COMPONENTS, Credential

ADMIN = Credential("test-admin", "test-admin-pw")
PASSWORDS = {c: f"pw-{c}-Kq81" for c in COMPONENTS}
CREDENTIALS = {c: Credential(c, p) for c, p in PASSWORDS.items()}
STARTUP_DEADLINE_SECONDS = 10.0


class AclRedis:
    def __init__(self, directory: Path, acl_text: str) -> None:
        self.port = free_port()
        self.acl = directory / "users.acl"
        self.acl.write_text(acl_text + f"user {ADMIN.user} on >{ADMIN.password} ~* &* +@all\n")
        self.log = directory / "redis.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.admin = self.client(ADMIN.user, ADMIN.password)

    def url(self, user: str, password: str) -> str:
        return f"redis://{user}:{password}@127.0.0.1:{self.port}/0"

    def client(self, user: str | None = None, password: str | None = None) -> redis.Redis:
        return redis.Redis(
            port=self.port, username=user, password=password, socket_connect_timeout=1, **CLIENT_OPTIONS
        )

    def start(self) -> None:
        args = [redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "no", "--aclfile", str(self.acl)]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + STARTUP_DEADLINE_SECONDS
        while True:
            with contextlib.suppress(redis.ConnectionError):
                if self.admin.ping():
                    return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server did not start: {self.log.read_text()[-500:]}")
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=0.02)  # the poll interval; notices a server that refused the file

    def stop(self) -> None:
        self.admin.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)

    def refusals(self) -> list[dict[str, Any]]:
        """The ACL log: every command refused since the start (user, reason, object, context)."""
        return [
            {k: e.get(k) for k in ("username", "reason", "object", "context", "count")}
            for e in self.admin.acl_log(count=1000)
        ]


@contextlib.contextmanager
def acl_redis(directory: Path, acl_text: str) -> Iterator[AclRedis]:
    server = AclRedis(directory, acl_text)
    server.start()
    try:
        yield server
    finally:
        server.stop()
