"""`ipamgc combined` under Redis users: its three components log in as their own users (`--redis-url`,
`--worker-redis-url`, `--leader-redis-url`), as they do in processes of their own, and release a leak
without one command refused; their heartbeats are written under their own users."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from lab.apiserver.apiserver import SimApiServer
from lab.apiserver.resources import RESOURCES
from lab.apiserver.store import Store
from lab.chaos import COMPONENT_ENV
from lab.cluster.cluster import SimCluster
from shared.acl import acl_file
from shared.keys import Keys
from tests.acl_redis import CREDENTIALS, PASSWORDS, acl_redis
from tests.fixtures.stack import ROOT, stop_processes
from tests.polling import wait_until

KEYS = Keys()


def test_combined_logs_in_as_each_components_user(tmp_path: Path) -> None:
    store = Store(RESOURCES, seed=7)
    sim = SimCluster(store, seed=7)
    sim.bootstrap("1s")
    sim.populate(nodes=3, pods_per_node=3)
    with (
        acl_redis(tmp_path, acl_file(KEYS, CREDENTIALS)) as server,
        SimApiServer(store, bookmark_interval=0.2) as api,
    ):
        kubeconfig = str(api.write_kubeconfig(tmp_path / "kubeconfig"))
        url = {c: server.url(c, PASSWORDS[c]) for c in ("watcher", "worker", "leader")}
        argv = [sys.executable, "-m", "ipamgc.commands.combined", "--kubeconfig", kubeconfig]
        argv += ["--redis-url", url["watcher"], "--worker-redis-url", url["worker"]]
        argv += ["--leader-redis-url", url["leader"]]
        env = {**os.environ, **COMPONENT_ENV, "IPAMGC_INSTANCE": "one-acl"}
        with (tmp_path / "combined.log").open("wb") as out:
            proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_until(lambda: server.admin.hget(KEYS.state, "synced") == b"1", timeout=30)
            sim.leak_pod_deleted_without_cni_del("ns-0", "pod-0000000")
            sim.leak_node_deleted("node-00002")
            assert sim.truth.leaked_ips()
            wait_until(
                lambda: not sim.truth.leaked_ips(), timeout=40, what="every leak released under the ACL"
            )
            assert sim.truth.violations == []
            for component in ("watcher", "worker", "leader"):
                key = KEYS.health(component, "one-acl")
                wait_until(lambda k=key: server.admin.exists(k), timeout=20, what=key)  # type: ignore[misc]
            assert proc.poll() is None, (tmp_path / "combined.log").read_text()[-3000:]
        finally:
            stop_processes([proc])
        assert server.refusals() == []
