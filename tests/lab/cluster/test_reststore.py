"""The simulated cluster's actors over HTTP (`RestStore`), here against the simulated API server (the
`realapi` tier runs them against a real kube-apiserver): the same scenarios, the ground truth kept by the
actors, frees by another writer seen through the watch and judged, the actors' own CNI DELs not."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lab.apiserver.apiserver import SimApiServer
from lab.apiserver.resources import resources_for
from lab.apiserver.store import SimApiError, Store
from lab.cluster.cluster import DEFAULT_POOLS, SimCluster
from lab.cluster.cni import CalicoCNI
from lab.cluster.restapi import RestStore
from shared.calicogroup import V1, V3
from tests.polling import wait_until


@pytest.fixture(params=[V1, V3], ids=["v1", "v3"])
def rest(request: pytest.FixtureRequest) -> Iterator[tuple[SimApiServer, RestStore]]:
    with SimApiServer(Store(resources=resources_for(request.param))) as server:
        store = RestStore(server.url, "unused", None, request.param)
        try:
            yield server, store
        finally:
            store.close()


def test_actors_over_http_keep_their_truth(rest: tuple[SimApiServer, RestStore]) -> None:
    server, store = rest
    sim = SimCluster(store, seed=3)  # type: ignore[arg-type]
    sim.bootstrap(leak_grace_period="1s")
    sim.add_node("n1")
    ips = sim.create_pod("ns", "a", "n1", dual_stack=True)
    sim.create_pod("ns", "b", "n1")
    assert server.store.get("pods", "ns", "a")["status"]["podIPs"] == [{"ip": ip} for ip in ips]
    sim.delete_pod("ns", "b")  # CNI DEL by the actors: not an external free
    leaked = sim.leak_pod_deleted_without_cni_del("ns", "a")
    with pytest.raises(SimApiError) as err:
        store.get("pods", "ns", "a")
    assert err.value.code == 404
    assert set(leaked) == sim.truth.leaked_ips()

    # Another writer (standing for ipamgc's leader) frees the leak through the server's own store.
    handle = next(u.handle for u in sim.truth.usages[leaked[0]])
    CalicoCNI(server.store, DEFAULT_POOLS, lambda: 0, SimApiError, store.calico).release_ips(handle, leaked)
    wait_until(lambda: not sim.truth.leaked_ips(), what="the external free seen through the watch")
    store.settle()
    assert {u.ip for u in sim.truth.released_leaks()} == set(leaked)
    assert sim.truth.violations == []
    assert sim.truth.unexpected == []


def test_an_external_free_of_an_ip_in_use_is_a_violation(rest: tuple[SimApiServer, RestStore]) -> None:
    server, store = rest
    sim = SimCluster(store, seed=4)  # type: ignore[arg-type]
    sim.bootstrap()
    sim.add_node("n1")
    [ip] = sim.create_pod("ns", "a", "n1")
    handle = sim.pod_handles[("ns", "a")][0]
    CalicoCNI(server.store, DEFAULT_POOLS, lambda: 0, SimApiError, store.calico).release_ips(handle, [ip])
    wait_until(lambda: sim.truth.violations, what="the violation")
    assert sim.truth.violations[0].ip == ip


def test_a_bulk_build_over_http_builds_the_cluster_built_in_process(
    rest: tuple[SimApiServer, RestStore],
) -> None:
    """The bulk loader's sweep over REST (`create_many`) keeps several requests in flight; the cluster the
    server ends with is the one built in process: every pod with its status and IPs, every handle."""
    server, store = rest
    sim = SimCluster(store, seed=5)  # type: ignore[arg-type]
    sim.bootstrap()
    sim.bulk_populate(nodes=4, pods_per_node=30)
    store.settle()
    local = SimCluster(Store(resources=resources_for(store.calico)), seed=5)
    local.bootstrap()
    local.bulk_populate(nodes=4, pods_per_node=30)
    served = server.store.list("pods")["items"]
    assert len(served) == 120
    want = {p["metadata"]["name"]: p["status"]["podIPs"] for p in local.store.list("pods")["items"]}
    assert {p["metadata"]["name"]: p["status"]["podIPs"] for p in served} == want
    assert {h["metadata"]["name"] for h in server.store.list("ipamhandles")["items"]} == {
        h["metadata"]["name"] for h in local.store.list("ipamhandles")["items"]
    }
    assert sim.truth.violations == []
