"""The Redis users of shared/acl.py as compose/ and deploy/ wire them: each component's URL logs in as its
own user on a redis-server that loads the very ACL file the stack would give it.

- compose: redis-users.acl (checked in) is `ipamgc redis-acl` for the URLs in docker-compose.yml, and
  the Redis service loads it;
- deploy: the Redis pod's init container runs `ipamgc redis-acl` on the `ipamgc-redis` Secret's URLs and
  Redis loads what it wrote; each Deployment reads its own component's URL.
Here the init container's command runs for real (no cluster: its env is resolved from the Secret by hand),
and redis-server loads its output.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import yaml

from redisio.client import redis_client
from shared.acl import COMPONENTS
from tests.acl_redis import AclRedis, acl_redis
from tests.deploy.conftest import COMPOSE, ROOT, Obj, find

DEPLOYMENTS = {"ipamgc-watcher": "watcher", "ipamgc-worker": "worker", "ipamgc-leader": "leader"}


def _local(url: str, port: int) -> str:
    """The same URL (user, password, database) pointed at the test's redis-server."""
    parts = urlsplit(url)
    auth = parts.netloc.rpartition("@")[0]
    return urlunsplit((parts.scheme, f"{auth}@127.0.0.1:{port}", parts.path, parts.query, ""))


def _whoami(server: AclRedis, url: str) -> str:
    """The user a connection made with `url` is logged in as (ACL WHOAMI is not granted to them: the
    admin reads it from CLIENT LIST by the connection's address)."""
    c = redis_client(_local(url, server.port))
    conn = c.connection_pool.get_connection()
    try:
        conn.send_command("PING")
        assert conn.read_response() in (b"PONG", "PONG")
        host, port = conn._sock.getsockname()[:2]  # type: ignore[union-attr]
        [entry] = [e for e in server.admin.client_list() if e["addr"] == f"{host}:{port}"]
        return str(entry["user"])
    finally:
        c.connection_pool.release(conn)
        c.close()


def _redis_acl(env: dict[str, str], out: Path | None = None) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-m", "ipamgc.commands.redis_acl"] + (["--output-file", str(out)] if out else [])
    return subprocess.run(
        args, check=False, cwd=ROOT, capture_output=True, text=True, timeout=60, env={**os.environ, **env}
    )


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc = yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())
    assert isinstance(doc, dict)
    return doc


def _compose_urls(compose: dict[str, Any]) -> dict[str, str]:
    services = compose["services"]
    urls = {c: services[c]["environment"]["REDIS_URL"] for c in ("watcher", "worker", "leader")}
    urls["reader"] = services["rq-dashboard"]["environment"]["REDIS_URL"]
    assert services["rq-exporter"]["environment"]["RQ_REDIS_URL"] == urls["reader"]  # read-only too
    return urls


def test_the_compose_acl_file_is_generated_from_the_compose_urls(compose: dict[str, Any]) -> None:
    urls = _compose_urls(compose)
    done = _redis_acl({f"IPAMGC_REDIS_URL_{c.upper()}": u for c, u in urls.items()})
    assert done.returncode == 0, done.stderr
    assert (COMPOSE / "redis-users.acl").read_text() == done.stdout, "regenerate compose/redis-users.acl"
    redis_service = compose["services"]["redis"]
    assert "./redis-users.acl:/etc/redis/users.acl:ro" in redis_service["volumes"]
    command = redis_service["command"]
    assert command[command.index("--aclfile") + 1] == "/etc/redis/users.acl"


def test_each_compose_url_logs_in_as_its_own_user(compose: dict[str, Any], tmp_path: Path) -> None:
    urls = _compose_urls(compose)
    with acl_redis(tmp_path, (COMPOSE / "redis-users.acl").read_text()) as server:
        for component, url in urls.items():
            assert _whoami(server, url) == component
        assert server.client().ping()  # `redis-cli ping`, the healthcheck, as the default user
        assert server.refusals() == []


def _secret(manifests: list[Obj]) -> dict[str, str]:
    [secret] = find(manifests, "Secret", "ipamgc-redis")
    data = secret["stringData"]
    assert isinstance(data, dict)
    return data


def _own_passwords(secret: dict[str, str]) -> dict[str, str]:
    """The Secret as an operator applies it: each placeholder password replaced by one of their own."""
    out = {}
    for key, url in secret.items():
        parts = urlsplit(url)
        assert parts.password and parts.password.startswith("change-me-"), "deploy/ ships placeholders"
        out[key] = url.replace(f":{parts.password}@", f":{secrets.token_hex(24)}@")
    return out


def _env_from_secret(container: Obj, secret: dict[str, str]) -> dict[str, str]:
    out = {}
    for e in container.get("env", []):
        ref = e["valueFrom"]["secretKeyRef"]
        assert ref["name"] == "ipamgc-redis"
        out[e["name"]] = secret[ref["key"]]
    return out


def test_the_deploy_redis_loads_the_acl_its_init_container_writes(
    manifests: list[Obj], tmp_path: Path
) -> None:
    secret = _own_passwords(_secret(manifests))
    [sts] = find(manifests, "StatefulSet", "ipamgc-redis")
    pod = sts["spec"]["template"]["spec"]
    [init] = pod["initContainers"]
    [server_container] = pod["containers"]
    args = server_container["args"]
    acl_path = Path(args[args.index("--aclfile") + 1])
    init_mount = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}
    server_mount = {m["name"]: m for m in server_container["volumeMounts"]}
    [(volume, mount)] = [(n, p) for n, p in init_mount.items() if acl_path.parent == Path(p)]
    assert server_mount[volume]["mountPath"] == mount and server_mount[volume]["readOnly"] is True
    assert {v["name"]: v for v in pod["volumes"]}[volume]["emptyDir"]["medium"] == "Memory"

    command = init["command"]
    assert command[:3] == ["python", "-m", "ipamgc.commands.redis_acl"]
    assert Path(command[command.index("--output-file") + 1]) == acl_path
    env = _env_from_secret(init, secret)
    assert set(env) == {f"IPAMGC_REDIS_URL_{c.upper()}" for c in COMPONENTS}
    out = tmp_path / "users.acl"
    done = _redis_acl(env, out)
    assert done.returncode == 0, done.stderr
    for password in (urlsplit(u).password for u in secret.values()):
        assert password and password not in out.read_text()  # stored hashed

    with acl_redis(tmp_path, out.read_text()) as server:
        for deployment, component in DEPLOYMENTS.items():
            [d] = find(manifests, "Deployment", deployment)
            [c] = d["spec"]["template"]["spec"]["containers"]
            url = _env_from_secret({"env": [e for e in c["env"] if e["name"] == "REDIS_URL"]}, secret)
            assert _whoami(server, url["REDIS_URL"]) == component
        assert _whoami(server, secret["reader-url"]) == "reader"
        assert server.client().ping()  # the probes' `redis-cli ping`
        assert server.refusals() == []


def test_the_acl_command_refuses_a_url_without_a_password() -> None:
    env = {f"IPAMGC_REDIS_URL_{c.upper()}": f"redis://{c}:pw@redis:6379/0" for c in COMPONENTS}
    env["IPAMGC_REDIS_URL_WORKER"] = "redis://redis:6379/0"
    done = _redis_acl(env)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "ipamgc redis-acl: error: the worker URL has no password (redis://worker:<password>@host/0)"
    ]


def test_the_init_container_refuses_the_shipped_placeholder_passwords(manifests: list[Obj]) -> None:
    """Applied as shipped, the Redis pod does not start: its init container refuses to write an ACL whose
    passwords anyone who read deploy/ knows (and the components refuse them too:
    tests/deploy/test_placeholder_passwords.py)."""
    [sts] = find(manifests, "StatefulSet", "ipamgc-redis")
    [init] = sts["spec"]["template"]["spec"]["initContainers"]
    done = _redis_acl(_env_from_secret(init, _secret(manifests)))
    assert done.returncode == 2 and done.stdout == ""
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("ipamgc redis-acl: error: the watcher URL's password is a placeholder"), line
