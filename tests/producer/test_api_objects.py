"""Malformed objects from the Kubernetes API, through the real watcher (list and watch over HTTP): each is
logged with its identity, counted (`WatchStats` `malformed.<kind>`), and replaced by what keeps IPs (a
pod or node stand-in, the mirrored block left as it was, an unset grace period, a datastore not ready);
the watcher goes on with the next object; and no release is ever decided from one of them."""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import redis

from kubeio.watch import Backoff, WatchEvent
from lab.apiserver.apiserver import SimApiServer
from lab.cluster.cluster import SimCluster
from lab.cluster.objects import node_object, pod_object
from producer import kube
from producer.kinds import Kind
from producer.reflector import Listed, Reflector, WatchStats
from producer.typed import convert
from shared.clock import FakeClock
from shared.keys import STATE_DATASTORE_READY, STATE_GRACE, pod_key
from shared.shard import DEFAULT_SHARDS
from tests.fixtures.redis import decisions
from tests.fixtures.stack import KEYS, allocation_ids, fast_settings, running_watcher
from tests.polling import wait_until
from workers.shards.validate import validate_shard

JsonObj = dict[str, Any]


@dataclass
class Case:
    name: str  # the bad-input class
    kind: Kind
    write: Callable[[SimCluster], str]  # makes the object malformed; returns how the log must name it


def _block(sim: SimCluster, node: str) -> JsonObj:
    return next(
        b for b in sim.store.list("ipamblocks")["items"] if b["spec"].get("affinity") == f"host:{node}"
    )


def _rewrite_block(node: str, change: Callable[[JsonObj], None]) -> Callable[[SimCluster], str]:
    """The block of `node` rewritten malformed: a MODIFIED event through the watch."""

    def write(sim: SimCluster) -> str:
        block = _block(sim, node)
        change(block["spec"])
        sim.store.replace("ipamblocks", None, block["metadata"]["name"], block)
        return f"IPAMBlock {block['metadata']['name']}"

    return write


def _new_block(name: str, spec: Callable[[SimCluster], Any]) -> Callable[[SimCluster], str]:
    """A malformed block created: an ADDED event."""

    def write(sim: SimCluster) -> str:
        body: JsonObj = {
            "apiVersion": "crd.projectcalico.org/v1",
            "kind": "IPAMBlock",
            "metadata": {"name": name},
        }
        value = spec(sim)
        if value is not None:
            body["spec"] = value
        sim.store.create("ipamblocks", None, body)
        return f"IPAMBlock {name}"

    return write


def _pod_status(ns: str, name: str, status: JsonObj) -> Callable[[SimCluster], str]:
    def write(sim: SimCluster) -> str:
        obj = sim.store.get("pods", ns, name)
        obj["status"] = status
        sim.store.replace("pods", ns, name, obj, subresource="status")
        return f"Pod {ns}/{name}"

    return write


def _spec_with_cidr(cidr: str) -> Callable[[SimCluster], JsonObj]:
    def spec(sim: SimCluster) -> JsonObj:
        value = copy.deepcopy(_block(sim, "node-00002")["spec"])
        value["cidr"] = cidr
        return value

    return spec


def _set(key: str, value: Any) -> Callable[[JsonObj], None]:
    def change(spec: JsonObj) -> None:
        spec[key] = value

    return change


def _index_out_of_range(spec: JsonObj) -> None:
    used = next(o for o, i in enumerate(spec["allocations"]) if i is not None)
    spec["allocations"][used] = 99


def _superscript_key(spec: JsonObj) -> None:
    seqs = spec["sequenceNumberForAllocation"]
    seqs["²"] = seqs.pop(next(iter(seqs)))


def _numeric_handle(spec: JsonObj) -> None:
    spec["attributes"][0]["handle_id"] = 12345


def _allocated_and_free(spec: JsonObj) -> None:
    used = next(o for o, i in enumerate(spec["allocations"]) if i is not None)
    spec["unallocated"].append(used)


def _pod_spec_string(sim: SimCluster) -> str:
    obj = sim.store.get("pods", "ns-3", "pod-0000003")
    obj["spec"] = "not an object"
    sim.store.replace("pods", "ns-3", "pod-0000003", obj)
    return "Pod ns-3/pod-0000003"


def _node_labels(sim: SimCluster) -> str:
    obj = sim.store.get("nodes", None, "node-00001")
    obj["metadata"]["labels"] = {"kubernetes.io/hostname": 7}
    sim.store.replace("nodes", None, "node-00001", obj)
    return "Node node-00001"


def _kcc(sim: SimCluster) -> str:
    obj = sim.store.get("kubecontrollersconfigurations", None, "default")
    obj["spec"]["controllers"]["node"]["leakGracePeriod"] = "fifteen minutes"
    sim.store.replace("kubecontrollersconfigurations", None, "default", obj)
    return "KubeControllersConfiguration default"


def _ci(sim: SimCluster) -> str:
    obj = sim.store.get("clusterinformations", None, "default")
    obj["spec"]["datastoreReady"] = "yes"
    sim.store.replace("clusterinformations", None, "default", obj)
    return "ClusterInformation default"


CASES = [
    Case(
        "IPAMBlock allocations length != size",
        Kind.BLOCKS,
        _rewrite_block("node-00000", lambda sp: sp["allocations"].pop()),
    ),
    Case(
        "IPAMBlock attribute index out of range",
        Kind.BLOCKS,
        _rewrite_block("node-00000", _index_out_of_range),
    ),
    Case(
        "IPAMBlock sequenceNumberForAllocation key '²'",
        Kind.BLOCKS,
        _rewrite_block("node-00001", _superscript_key),
    ),
    Case(
        "IPAMBlock unknown affinity prefix",
        Kind.BLOCKS,
        _rewrite_block("node-00001", _set("affinity", "pool:x")),
    ),
    Case("IPAMBlock non-string handle_id", Kind.BLOCKS, _rewrite_block("node-00002", _numeric_handle)),
    Case(
        "IPAMBlock ordinal allocated and free", Kind.BLOCKS, _rewrite_block("node-00002", _allocated_and_free)
    ),
    Case(
        "IPAMBlock negative sequence number",
        Kind.BLOCKS,
        _rewrite_block("node-00000", _set("sequenceNumber", -5)),
    ),
    Case("IPAMBlock without spec", Kind.BLOCKS, _new_block("10-98-0-0-26", lambda s: None)),
    Case(
        "IPAMBlock with a bad CIDR",
        Kind.BLOCKS,
        _new_block("10-97-0-0-26", _spec_with_cidr("10.64.300.0/26")),
    ),
    Case(
        "IPAMBlock CIDR with host bits",
        Kind.BLOCKS,
        _new_block("10-99-0-0-26", _spec_with_cidr("10.99.0.1/26")),
    ),
    Case(
        "Pod with an impossible IP",
        Kind.PODS,
        _pod_status("ns-0", "pod-0000000", {"phase": "Running", "podIP": "999.1.1.1"}),
    ),
    Case(
        "Pod whose podIPs is not a list",
        Kind.PODS,
        _pod_status("ns-1", "pod-0000001", {"podIPs": "10.64.0.9"}),
    ),
    Case(
        "Pod whose podIPs entry has no ip",
        Kind.PODS,
        _pod_status("ns-2", "pod-0000002", {"podIPs": [{"x": 1}]}),
    ),
    Case("Pod whose spec is not an object", Kind.PODS, _pod_spec_string),
    Case("Node whose labels are not strings", Kind.NODES, _node_labels),
    Case("KubeControllersConfiguration with an unparsable grace", Kind.CONTROLLERS_CONFIG, _kcc),
    Case("ClusterInformation with a non-boolean datastoreReady", Kind.CLUSTER_INFO, _ci),
]


def _restore_config(sim: SimCluster) -> None:
    kcc = sim.store.get("kubecontrollersconfigurations", None, "default")
    kcc["spec"]["controllers"]["node"]["leakGracePeriod"] = "1s"
    sim.store.replace("kubecontrollersconfigurations", None, "default", kcc)
    ci = sim.store.get("clusterinformations", None, "default")
    ci["spec"]["datastoreReady"] = True
    sim.store.replace("clusterinformations", None, "default", ci)


def test_malformed_api_objects_are_logged_counted_skipped_and_never_released(
    server: SimApiServer,
    sim: SimCluster,
    client: redis.Redis,
    redis_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="producer.reflector")
    sim.bootstrap("1s")
    sim.populate(nodes=4, pods_per_node=2)
    # What a release decided from a malformed object would touch: every allocation of the malformed
    # blocks' nodes, and of the malformed pods.
    guarded = allocation_ids(sim, node="node-00000") | allocation_ids(sim, node="node-00001")
    guarded |= allocation_ids(sim, node="node-00002")
    with running_watcher(server, fast_settings(redis_url)) as rw:
        w = rw.watcher
        wait_until(w.synced.is_set, timeout=10)
        named: list[tuple[str, str]] = []
        for i, case in enumerate(CASES):
            before = w.stats.get("malformed", case.kind)
            named.append((case.name, case.write(sim)))
            # The next good object is mirrored: the watcher went on.
            sim.create_pod("canary", f"canary-{i}", "node-00003")
            wait_until(lambda i=i: client.hexists(KEYS.pods, pod_key("canary", f"canary-{i}")), timeout=10)
            # Each kind's watch thread reads in its own gulps: the malformed object's stream may come later.
            wait_until(lambda c=case, b=before: w.stats.get("malformed", c.kind) > b, timeout=10)
            assert w.stats.get("malformed", case.kind) > before, case.name
            assert rw.exit_code is None and rw.thread.is_alive(), case.name
        # An unparsable grace period is Calico's unset; a non-boolean readiness is "not ready".  (Counted
        # when read, applied with the publisher's next batch: wait for it.)
        wait_until(lambda: client.hget(KEYS.state, STATE_DATASTORE_READY) == b"0", timeout=10)
        assert client.hget(KEYS.state, STATE_GRACE) is None
        assert client.hget(KEYS.state, STATE_DATASTORE_READY) == b"0"
        _restore_config(sim)
        wait_until(lambda: client.hget(KEYS.state, STATE_DATASTORE_READY) == b"1", timeout=10)
        wait_until(lambda: client.hget(KEYS.state, STATE_GRACE) == b"1.0", timeout=10)
        # A control leak beside them (node-00003 is healthy): the pipeline does decide real leaks.
        control = set(sim.pod_handles[("canary", "canary-0")][1])
        sim.leak_pod_deleted_without_cni_del("canary", "canary-0")
        wait_until(lambda: not client.hexists(KEYS.pods, pod_key("canary", "canary-0")), timeout=10)
        logged = "\n".join(r.getMessage() for r in caplog.records)
        for case_name, identity in named:
            assert f"malformed {identity}" in logged, (case_name, identity)
    # Validate twice, a long grace period apart: every candidate would be confirmed by then.
    clock = FakeClock(time.time())
    for _ in range(2):
        for s in range(DEFAULT_SHARDS):
            validate_shard(s, client=client, keys=KEYS, clock=clock)
        clock.advance(3600)
    decided = {d.alloc_id for d in decisions(client, KEYS)}
    assert decided & guarded == set()
    assert {d.ip for d in decisions(client, KEYS)} >= control


def test_objects_without_identity_are_counted_and_keep_everything(caplog: pytest.LogCaptureFixture) -> None:
    """Objects that cannot even be named (no metadata, no name, not an object): a list that holds one
    deletes nothing from the mirror; a watch event carrying one is dropped; each is counted."""
    caplog.set_level(logging.WARNING, logger="producer.reflector")
    stats = WatchStats()
    listed: list[Any] = []

    class Api:
        def pages(self, kind: Kind, typed: bool = False) -> list[kube.Page]:
            items: list[Any] = [
                pod_object("ns", "good", "node-1", ["10.0.0.1"]),
                {"kind": "Pod"},
                {"metadata": {"name": 7}},
                {"metadata": {"namespace": "ns"}},
            ]
            return [kube.Page(items, "10", True)]

    stop = threading.Event()
    reflector = Reflector(Api(), Kind.PODS, listed.append, stats, stop, Backoff(0.01, 0.01))  # type: ignore[arg-type]
    assert reflector._list() == "10"
    [item] = listed
    assert isinstance(item, Listed)
    assert item.keep is None  # an unidentifiable object: nothing mirrored is deleted on its account
    assert [getattr(o, "name", None) for o in item.objects] == ["good"]
    assert stats.get("malformed", "pods") == 3
    for raw in ("not an object", ["a"], {"metadata": []}, None):
        event = WatchEvent("MODIFIED", raw, "11")  # type: ignore[arg-type]
        assert reflector._changed(event, "11") is None
    assert stats.get("malformed", "pods") == 7
    node = convert(Kind.NODES, {"metadata": {"name": "n1", "labels": []}})
    assert node.obj is not None and node.problem is not None  # a stand-in: the node exists
    assert convert(Kind.NODES, node_object("n2")).problem is None
    assert "malformed Pod" in "\n".join(r.getMessage() for r in caplog.records)
