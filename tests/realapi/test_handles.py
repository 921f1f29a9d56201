"""The handle collector on a real kube-apiserver (issue 46): an IPAMHandle lost after its block was written
(a CNI crash between Calico's two writes, #3940) is recreated, as the leader's ServiceAccount, with what
the blocks hold, on both of Calico's API groups.  The leader runs in this process on a fake clock, so that
the repair's wait (the grace period, at least 5 minutes, and three scans) passes in seconds; its requests
are the real server's, under RBAC, and counted by the tier's audit (test_zz_rbac.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis

from kubeio.client import api_client
from kubeio.election import Leadership
from lab.apiserver.resources import SimApiError
from lab.cluster.restapi import RestStore
from lab.realapi import RealCluster
from shared.clock import FakeClock
from shared.config import Settings
from shared.keys import STATE_SYNCED, Keys
from shared.names import handle_name
from tests.fixtures.leader import leader_settings
from tests.polling import wait_until
from tests.realapi.conftest import Components, actors, settle
from workers.leader import kube
from workers.leader.loop import Leader

pytestmark = pytest.mark.realapi

SCAN = 60.0  # fake seconds between the collector's scans


@pytest.mark.parametrize("group", ["v1", "v3"])
def test_a_lost_handle_is_recreated_with_what_its_blocks_hold(
    group: str,
    real_v1: RealCluster,
    real_v3: RealCluster,
    client: redis.Redis,
    redis_url: str,
    tmp_path: Path,
) -> None:
    cluster = real_v1 if group == "v1" else real_v3
    with actors(cluster) as sim:
        node = "handles-0"
        sim.add_node(node)
        ips = sim.create_pod("handles", "web-0", node)
        settle(sim)
        handle = sim.pod_handles[("handles", "web-0")][0]
        store = cluster.store()
        try:
            name = handle_name(handle)
            before = store.get("ipamhandles", None, name)
            store.delete("ipamhandles", None, name)  # the CNI crashed after the block write

            comps = Components(cluster, redis_url, tmp_path)
            comps.start("watch")  # the mirror the leader's gate reads
            try:
                wait_until(lambda: client.hget(Keys().state, STATE_SYNCED) is not None, timeout=60)
                api = kube.CalicoApi(api_client(str(cluster.kubeconfig("leader"))), calico=cluster.group)
                clock = FakeClock(time.time())
                lead = Leader(
                    leader_settings(
                        handle_gc=True, handle_gc_interval_seconds=SCAN, base=Settings(redis_url=redis_url)
                    ),
                    client,
                    api,
                    Leadership.granted("leader-a"),
                    clock=clock,
                )
                lead.start()
                for _ in range(12):  # three scans and 5 minutes of fake time, and then some
                    lead.step()
                    clock.advance(SCAN)
                    if _exists(store, name):
                        break
            finally:
                comps.stop()
            after = store.get("ipamhandles", None, name)
            assert after["spec"]["handleID"] == handle
            assert after["spec"]["block"] == before["spec"]["block"]  # what the blocks hold
            assert sim.cni.ips_by_handle(handle) == ips  # IPsByHandle and ReleaseByHandle work again
        finally:
            store.close()


def _exists(store: RestStore, name: str) -> bool:
    try:
        store.get("ipamhandles", None, name)
    except SimApiError as exc:
        if exc.code == 404:
            return False
        raise
    return True
