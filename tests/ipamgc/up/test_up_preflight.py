"""`ipamgc up` fails loudly: its pre-flight checks refuse a Redis, a kubeconfig, a grace period or a
metrics port that cannot work before anything starts, with one line and exit 2; a component that keeps
failing once started stops `up` (exit 1) with the component's last error line on the console."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.apiserver.apiserver import SimApiServer
from lab.cluster.cluster import SimCluster

ROOT = Path(__file__).resolve().parents[3]


def _up(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ipamgc", "up", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again: nothing listens there


def _kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: c, cluster: {{server: '{server}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n"
    )
    return path


def _one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("ipamgc up: error: "), lines
    return lines[0]


def test_up_refuses_an_unreachable_redis_before_starting_anything(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    url = f"redis://127.0.0.1:{_dead_port()}/0"
    proc = _up("--redis-url", url, "--metrics-port", "0", "--log-dir", str(logs))
    assert proc.returncode == 2
    assert f"cannot reach Redis at {url}" in _one_error_line(proc)
    assert not logs.exists()  # nothing was started


def test_up_hides_the_password_of_a_redis_url_it_cannot_reach() -> None:
    proc = _up("--redis-url", f"redis://u:s3cret@127.0.0.1:{_dead_port()}/0", "--metrics-port", "0")
    assert proc.returncode == 2
    line = _one_error_line(proc)
    assert "s3cret" not in line and "u:***@127.0.0.1" in line


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "no such file"),
        ("clusters: [\n  bad", "cannot load Kubernetes configuration"),
        ("clusters: 5\n", "not a kubeconfig"),
        ("unreachable", "Connection refused"),
    ],
    ids=["missing", "bad-yaml", "wrong-shape", "unreachable"],
)
def test_up_refuses_a_kubeconfig_that_cannot_work(
    tmp_path: Path, redis_url: str, content: str | None, expected: str
) -> None:
    path = tmp_path / "kubeconfig"
    if content == "unreachable":
        _kubeconfig(path, f"http://127.0.0.1:{_dead_port()}")
    elif content is not None:
        path.write_text(content)
    proc = _up("--kubeconfig", str(path), "--redis-url", redis_url, "--metrics-port", "0")
    assert proc.returncode == 2
    assert expected in _one_error_line(proc)


def test_up_refuses_a_cluster_without_calicos_crds(tmp_path: Path, redis_url: str) -> None:
    # The simulated API server answers nodes and pods; a path it does not know answers 404, as a cluster
    # without Calico answers for ipamblocks.  A prefix on the server URL gives that for every list.
    with SimApiServer() as srv:
        path = _kubeconfig(tmp_path / "kubeconfig", srv.url + "/nothing-here")
        proc = _up("--kubeconfig", str(path), "--redis-url", redis_url, "--metrics-port", "0")
    assert proc.returncode == 2
    assert "HTTP 404" in _one_error_line(proc)


def test_up_refuses_a_bad_grace_period_and_a_taken_metrics_port() -> None:
    bad = _up("--leak-grace-period", "5x", "--metrics-port", "0")
    assert bad.returncode == 2
    assert "--leak-grace-period '5x'" in _one_error_line(bad)
    with _taken_between_free_ports() as port:
        # The watcher would take port-2, the two workers port-1 and port, the leader port+1.
        proc = _up("--metrics-port", str(port - 2))
    assert proc.returncode == 2
    assert f"metrics port {port} (worker-1) is not free" in _one_error_line(proc)


@contextlib.contextmanager
def _taken_between_free_ports() -> Iterator[int]:
    """A port held here whose neighbours up would take first (port-2, port-1) and after (port+1) are
    free: another process on one of them would make up name that one (a CI run once met it)."""
    for _ in range(50):
        with socket.socket() as taken:
            taken.bind(("0.0.0.0", 0))
            taken.listen()
            port = int(taken.getsockname()[1])
            if all(_free(p) for p in (port - 2, port - 1, port + 1)):
                yield port
                return
    pytest.fail("no free port with free neighbours in 50 tries")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def test_up_stops_when_a_component_keeps_failing_with_its_last_error_line(
    server: SimApiServer, sim: SimCluster, redis_url: str, tmp_path: Path
) -> None:
    sim.bootstrap("1s")
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
    # Passes up's checks (up does not read it) but every component refuses it: a bad environment.
    env = {**os.environ, "IPAMGC_SHARDS": "zero"}
    proc = _up(
        "--kubeconfig", str(kubeconfig), "--redis-url", redis_url, "--metrics-port", "0",
        "--log-dir", str(tmp_path / "logs"), "--duration", "60",
        env=env,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ipamgc up: error: "), proc.stderr
    assert "keeps failing (exited once, status 2)" in last
    assert "IPAMGC_SHARDS='zero': expected an integer" in last
    assert str(tmp_path / "logs") in last
