"""Calico 3.33's legacy per-node series and `ipam_ippool_reserved`, served by the active watcher beside the
current names (producer/pool_metrics.py).  The expected values are computed here from the simulated
store with Calico's definitions (kube-controllers/pkg/controllers/node/ipam.go, release-v3.33), not from
ipamgc's tally."""

from __future__ import annotations

import ipaddress
from collections import Counter

import pytest
import redis

from lab.apiserver.apiserver import SimApiServer
from lab.apiserver.store import Store
from lab.cluster.cluster import SimCluster
from producer.pool_metrics import legacy_families, parse_reservations, reserved_in
from shared.parse import parse_block
from tests.fixtures.stack import caught_up, fast_settings
from tests.fixtures.watcher_metrics import watcher_with_metrics
from tests.polling import wait_until

V4, V6 = "default-ipv4-ippool", "default-ipv6-ippool"


def calico_legacy(store: Store) -> dict[str, Counter[str]]:
    """Calico's updateMetrics, legacy half: allocations with a handle and a `node` attribute per node;
    borrowed when the block is not `host:`-affine to that node; blocks per affine host / no_affinity."""
    out: dict[str, Counter[str]] = {"allocations": Counter(), "borrowed": Counter(), "blocks": Counter()}
    for raw in store.list("ipamblocks")["items"]:
        block = parse_block(raw)
        if block.deleted:
            continue
        out["blocks"][block.host or "no_affinity"] += 1
        for a in block.iter_allocations():
            if not a.node:
                continue
            out["allocations"][a.node] += 1
            if block.host is None or a.node != block.host:
                out["borrowed"][a.node] += 1
    return out


def _reservation(name: str, cidrs: list[str]) -> dict[str, object]:
    return {
        "apiVersion": "crd.projectcalico.org/v1",
        "kind": "IPReservation",
        "metadata": {"name": name},
        "spec": {"reservedCIDRs": cidrs},
    }


def test_legacy_series_and_reserved_addresses_beside_the_current_names(
    server: SimApiServer, sim: SimCluster, client: redis.Redis, redis_url: str
) -> None:
    sim.bootstrap("15m")
    sim.populate(nodes=3, pods_per_node=4)
    sim.create_pod("ns-x", "dual", "node-00001", dual_stack=True)
    # Borrowed: an IP of node-00000's block whose `node` attribute is node-00002.
    sim.cni.assign("node-00000", "borrowed-1", {"node": "node-00002"})
    # An allocation without a `node` attribute: in ipam_allocations_in_use as unknown_node, but not in
    # Calico's legacy per-node allocations.
    sim.cni.assign("node-00000", "loadbalancer-1", {})
    sim.store.create(
        "ipreservations", None, _reservation("edge", ["10.64.0.0/30", "10.64.0.2", "10.70.0.0/24"])
    )
    sim.store.create("ipreservations", None, _reservation("v6", ["fd00:10::/120", "not-an-ip"]))
    with watcher_with_metrics(server, fast_settings(redis_url, election=True)) as r:
        wait_until(lambda: r.watcher.synced.is_set() and caught_up(r.watcher, server), timeout=15)
        r.metrics.refresh()
        expected = calico_legacy(sim.store)
        assert expected["borrowed"]  # the scenario has borrowed IPs, so the comparison means something
        got = {
            "allocations": r.family("ipam_allocations_per_node"),
            "borrowed": r.family("ipam_allocations_borrowed_per_node"),
            "blocks": r.family("ipam_blocks_per_node"),
        }
        for name, values in expected.items():
            assert got[name] == {(node,): float(v) for node, v in values.items()}, name
        # They are the current per-(pool, node) series summed over pools (the current ones still served).
        in_use = r.family("ipam_allocations_in_use")
        assert in_use[(V4, "unknown_node")] == 1.0
        per_node: Counter[str] = Counter()
        for (_pool, node), v in in_use.items():
            if node != "unknown_node":
                per_node[node] += int(v)
        assert {(n,): float(v) for n, v in per_node.items() if v} == got["allocations"]
        # 10.64.0.0/30 and 10.64.0.2 overlap (4 addresses once), 10.70.0.0/24 is inside the /10 (256);
        # the IPv6 /120 is 256 of the v6 pool; the malformed entry is skipped.
        assert r.family("ipam_ippool_reserved") == {(V4,): 4.0 + 256, (V6,): 256.0}

        # A new reservation shows at the next refresh; the legacy series follow events without one.
        sim.store.create("ipreservations", None, _reservation("more", ["10.64.1.0/29"]))
        sim.create_pod("ns-x", "late", "node-00002")
        wait_until(lambda: caught_up(r.watcher, server), timeout=10)
        wait_until(
            lambda: (
                r.family("ipam_allocations_per_node")
                == {(n,): float(v) for n, v in calico_legacy(sim.store)["allocations"].items()}
            ),
            timeout=10,
        )
        r.metrics.refresh()
        assert r.family("ipam_ippool_reserved")[(V4,)] == 4.0 + 256 + 8


@pytest.mark.parametrize(
    ("pool", "reserved", "count"),
    [
        ("10.0.0.0/24", [], 0),
        ("10.0.0.0/24", ["10.0.0.0/26", "10.0.0.0/28", "10.0.0.5/32"], 64),  # nested: once
        ("10.0.0.0/24", ["10.0.0.0/25", "10.0.0.128/25"], 256),  # adjacent halves: the whole pool
        ("10.0.0.0/24", ["10.0.0.0/16"], 256),  # a reservation wider than the pool
        ("10.0.0.0/24", ["10.0.1.0/24", "fd00::/64"], 0),  # outside, other family
        ("fd00::/120", ["fd00::/124", "fd00::ff/128"], 17),
    ],
)
def test_reserved_addresses_count_once(pool: str, reserved: list[str], count: int) -> None:
    nets = [ipaddress.ip_network(c) for c in reserved]
    assert reserved_in(ipaddress.ip_network(pool), nets) == count


def test_reservations_parse_cidrs_and_ips_and_skip_what_is_malformed() -> None:
    items = [
        _reservation("a", ["10.0.0.1", " 10.0.1.0/24 ", "", "bogus", "10.0.2.7/24"]),
        {
            "metadata": {"name": "gone", "deletionTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"reservedCIDRs": ["1.1.1.1"]},
        },
        {"metadata": {"name": "no-spec"}},
        "not an object",
    ]
    assert [str(n) for n in parse_reservations(items)] == ["10.0.0.1/32", "10.0.1.0/24", "10.0.2.0/24"]


def test_legacy_families_sum_over_pools_and_leave_out_unknown_node() -> None:
    in_use = {(V4, "a"): 2, (V6, "a"): 1, (V4, "unknown_node"): 5, (V4, "b"): 0}
    borrowed = {(V4, "a"): 1}
    blocks = {(V4, "a"): 1, (V6, "a"): 1, ("no_ippool", "no_affinity"): 2}
    fams = {
        f.name: {s.labels["node"]: s.value for s in f.samples}
        for f in legacy_families(in_use, borrowed, blocks)
    }
    assert fams == {
        "ipam_allocations_per_node": {"a": 3},
        "ipam_allocations_borrowed_per_node": {"a": 1},
        "ipam_blocks_per_node": {"a": 2, "no_affinity": 2},
    }
