"""The Calico API group over real HTTP: the simulated cluster serves Calico's objects in one group only (and
says so in discovery, and types what that group's CRDs type); both Kubernetes edges (`producer/kube.py`,
`workers/kube.py`) discover it as Calico does, or take the configured one, and read and write there."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s

from ipamgc.inventory import fetch_live_inventory
from kubeio.errors import KubePermanentError, KubeTransientError, NotFound
from lab.apiserver.apiserver import SimApiServer
from lab.apiserver.resources import resources_for
from lab.apiserver.store import SimApiError, Store
from lab.cluster.cluster import SimCluster
from producer.kinds import Kind
from producer.kube import KubeApi, list_calico_items
from shared.calicogroup import V1, V3, CalicoGroup
from shared.names import LABEL_HOSTNAME_HASH, affinity_name
from shared.netaddr import parse_network
from workers.leader import kube as workers_kube


@pytest.fixture(params=[V1, V3], ids=["v1", "v3"])
def group(request: pytest.FixtureRequest) -> CalicoGroup:
    group: CalicoGroup = request.param
    return group


@pytest.fixture
def served(group: CalicoGroup) -> Iterator[tuple[SimApiServer, SimCluster]]:
    store = Store(resources_for(group), seed=5)
    with SimApiServer(store, bookmark_interval=0.2) as server:
        sim = SimCluster(store, seed=5)
        sim.bootstrap("15m")
        sim.populate(nodes=2, pods_per_node=2)
        yield server, sim


def _groups(api: k8s.ApiClient) -> set[str]:
    return {g.name for g in k8s.ApisApi(api).get_api_versions().groups}


def test_the_sim_serves_calicos_objects_in_one_group_only(
    served: tuple[SimApiServer, SimCluster], group: CalicoGroup
) -> None:
    server, sim = served
    other = V1 if group is V3 else V3
    with server.api_client() as api:
        assert group.name in _groups(api) and other.name not in _groups(api)
        custom = k8s.CustomObjectsApi(api)
        blocks = custom.list_cluster_custom_object(group.name, group.version, "ipamblocks")
        assert blocks["apiVersion"] == group.api_version and len(blocks["items"]) == 2
        config = custom.get_cluster_custom_object(
            group.name, group.version, group.plural("ipamconfigs"), "default"
        )
        assert (config["apiVersion"], config["kind"]) == (group.api_version, group.kind("ipamconfigs"))
        with pytest.raises(k8s.ApiException) as info:
            custom.list_cluster_custom_object(other.name, other.version, "ipamblocks")
        assert info.value.status == 404
    # The CNI wrote each affinity's `deleted` as the group's CRD types it.
    affinities = sim.store.list("blockaffinities")["items"]
    assert affinities and all(a["spec"]["deleted"] == group.affinity_deleted(False) for a in affinities)


def test_the_sims_crd_refuses_the_other_groups_affinity_deleted(
    served: tuple[SimApiServer, SimCluster], group: CalicoGroup
) -> None:
    _, sim = served
    [aff] = [a for a in sim.store.list("blockaffinities")["items"] if a["spec"]["node"] == "node-00000"]
    other = V1 if group is V3 else V3
    aff["spec"]["deleted"] = other.affinity_deleted(False)
    with pytest.raises(SimApiError) as info:
        sim.store.replace("blockaffinities", None, aff["metadata"]["name"], aff)
    assert info.value.code == 422 and "spec.deleted" in info.value.message
    aff["spec"]["deleted"] = group.affinity_deleted(True)
    sim.store.replace("blockaffinities", None, aff["metadata"]["name"], aff)


def test_the_watchers_edge_discovers_the_group_and_lists_there(
    served: tuple[SimApiServer, SimCluster], group: CalicoGroup, tmp_path: Path
) -> None:
    server, _ = served
    with server.api_client() as api:
        kapi = KubeApi(api)
        assert kapi.calico() is group
        assert kapi.object_kind(Kind.IPAM_CONFIG) == (group.kind("ipamconfigs"), group.api_version)
        items, _ = kapi.items(Kind.IPAM_CONFIG)
        assert [i["metadata"]["name"] for i in items] == ["default"]
        assert len(kapi.items(Kind.BLOCKS)[0]) == 2
        assert [p["spec"]["cidr"] for p in list_calico_items(kapi, "ippools")] == [
            "10.64.0.0/10",
            "fd00:10::/104",
        ]
    # Discovery was asked once; every Calico request went to the group it named.
    assert len([r for r in server.requests if r.verb == "discovery"]) == 1
    calico = [r for r in server.requests if r.resource not in (None, "nodes", "pods")]
    assert calico and all(r.path.startswith(f"/apis/{group.api_version}/") for r in calico)
    live = fetch_live_inventory(str(server.write_kubeconfig(tmp_path / "kubeconfig")))
    kinds = {(i["kind"], i["apiVersion"]) for i in live if i["kind"] not in ("Node", "Pod")}
    assert kinds == {(k, group.api_version) for k in ("IPAMBlock", "IPAMHandle", "BlockAffinity")}


def test_the_leaders_edge_discovers_the_group_and_writes_there(
    served: tuple[SimApiServer, SimCluster], group: CalicoGroup
) -> None:
    server, _ = served
    with server.api_client() as api:
        capi = workers_kube.CalicoApi(api)
        assert capi.calico() is group
        config = capi.get("ipamconfigs", "default")
        assert config["kind"] == group.kind("ipamconfigs")
        name = affinity_name("node-00000", parse_network("10.64.0.0/26"))
        aff = capi.get("blockaffinities", name)
        assert aff["spec"]["deleted"] == group.affinity_deleted(False)
        aff["spec"]["state"] = "pendingDeletion"  # the leader's first step; `deleted` kept as read
        written = capi.replace("blockaffinities", aff)
        assert written["metadata"]["resourceVersion"] != aff["metadata"]["resourceVersion"]
        assert written["spec"]["deleted"] == group.affinity_deleted(False)
        selector = f"{LABEL_HOSTNAME_HASH}={aff['metadata']['labels'][LABEL_HOSTNAME_HASH]}"
        [listed] = capi.list("blockaffinities", selector)
        assert listed["metadata"]["name"] == name


def test_a_configured_group_is_used_without_discovery(
    served: tuple[SimApiServer, SimCluster], group: CalicoGroup
) -> None:
    server, _ = served
    other = V1 if group is V3 else V3
    with server.api_client() as api:
        kapi = KubeApi(api, calico=other)
        with pytest.raises(KubePermanentError, match="HTTP 404"):
            kapi.items(Kind.BLOCKS)  # the operator said so: nothing is guessed, nothing is found
        capi = workers_kube.CalicoApi(api, calico=other)
        with pytest.raises(NotFound):
            capi.get("ipamconfigs", "default")
    assert not [r for r in server.requests if r.verb == "discovery"]


def test_a_failed_discovery_is_an_error_of_that_call_and_is_retried(
    served: tuple[SimApiServer, SimCluster], group: CalicoGroup
) -> None:
    server, _ = served
    server.faults.add(verbs={"discovery"}, error_rate=1.0, error_code=503, times=2)
    with server.api_client() as api:
        kapi = KubeApi(api)
        with pytest.raises(KubeTransientError, match="discover API groups: HTTP 503"):
            kapi.items(Kind.BLOCKS)
        capi = workers_kube.CalicoApi(api)
        with pytest.raises(workers_kube.ApiUnavailable, match="discover API groups"):
            capi.get("ipamconfigs", "default")
        assert kapi.calico() is group and capi.calico() is group  # the next attempt asks again
        assert len(kapi.items(Kind.BLOCKS)[0]) == 2


def test_the_commands_take_the_group_as_a_flag_or_from_the_environment(
    served: tuple[SimApiServer, SimCluster], group: CalicoGroup, tmp_path: Path
) -> None:
    from click.testing import CliRunner

    from ipamgc.cli import cli

    server, _ = served
    other = V1 if group is V3 else V3
    kubeconfig = str(server.write_kubeconfig(tmp_path / "kubeconfig"))
    runner = CliRunner()
    right = runner.invoke(cli, ["check", "--kubeconfig", kubeconfig, "--calico-api-group", str(group)])
    assert right.exit_code == 0, right.output
    wrong = runner.invoke(cli, ["check", "--kubeconfig", kubeconfig], env={"CALICO_API_GROUP": str(other)})
    assert wrong.exit_code == 2 and "HTTP 404" in wrong.stderr and wrong.stderr.count("\n") == 1
    for command in ("check", "watch", "lead", "release"):
        bad = runner.invoke(cli, [command, "--calico-api-group", "calico/v9"])
        assert bad.exit_code == 2, (command, bad.output)
        assert "expected projectcalico.org/v3 or crd.projectcalico.org/v1" in bad.output
