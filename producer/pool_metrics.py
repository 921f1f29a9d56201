"""Calico 3.33's other IPAM series, beside the per-(pool, node) gauges of `producer/metrics_families.py`.

Why a module of its own: these are Calico's compatibility and pool-level series, with their own source
(kube-controllers/pkg/controllers/node/ipam.go, release-v3.33), and `producer/tally.py` is the hot path's
tally.  Nothing here runs per event: the legacy gauges are sums of the tally's totals at scrape time, the
reservations are listed with the pools at each refresh (15 s).

- Legacy per-node gauges, "retained for compatibility" by Calico (still registered in 3.33), label `node`
  only, summed over pools:
  `ipam_allocations_per_node` — allocations with a handle and a `node` attribute, per node (Calico's
  `allocationState`: an allocation without a `node` attribute is not counted, so no `unknown_node`);
  `ipam_allocations_borrowed_per_node` — those in a block not affine (`host:`) to that node;
  `ipam_blocks_per_node` — blocks per affine host, `no_affinity` for the rest.
  Calico resets them every sync and sets only the nodes it has: no zero pre-seeding (unlike the new ones).
- `ipam_ippool_reserved{ippool}` — addresses of the pool that an IPReservation covers (so cannot be
  assigned), allocated or not; overlapping and nested reservations count once (Calico's
  `ipam.NumReservedIPsInCIDR`).  A reservation entry may be a CIDR or a single IP; a malformed one is
  skipped with a warning, as Calico does.
"""

from __future__ import annotations

import ipaddress
import logging
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

from producer.kube import KubeApi, list_calico_items
from shared import metrics_names as m
from shared.netaddr import IPNetwork

log = logging.getLogger(__name__)

PoolNode = tuple[str, str]


# -- IPReservations -----------------------------------------------------------------------------------


def parse_reservations(items: Iterable[object]) -> tuple[IPNetwork, ...]:
    """Every reserved CIDR of raw IPReservation objects (`spec.reservedCIDRs`: CIDRs or IPs)."""
    out: list[IPNetwork] = []
    for raw in items:
        if not isinstance(raw, dict):
            continue
        meta, spec = raw.get("metadata"), raw.get("spec")
        name = meta.get("name") if isinstance(meta, dict) else None
        if isinstance(meta, dict) and meta.get("deletionTimestamp"):
            continue
        cidrs = spec.get("reservedCIDRs") if isinstance(spec, dict) else None
        for text in cidrs if isinstance(cidrs, list) else []:
            if not isinstance(text, str) or not text.strip():
                continue
            try:
                out.append(ipaddress.ip_network(text.strip(), strict=False))
            except ValueError:
                log.warning("IPReservation %r: malformed reserved CIDR %r ignored", name, text)
    return tuple(out)


def list_ipreservations(api: KubeApi, timeout: tuple[float, float] = (10.0, 30.0)) -> tuple[IPNetwork, ...]:
    """Every reserved CIDR (`list ipreservations` in the chosen Calico group, raw JSON)."""
    return parse_reservations(list_calico_items(api, "ipreservations", timeout))


def reserved_in(pool: IPNetwork, reserved: Iterable[IPNetwork]) -> int:
    """Addresses of `pool` covered by `reserved` (each address once, however the CIDRs overlap).

    Prefixes either nest or are disjoint, so after collapsing the reservations of the pool's family into
    disjoint prefixes each one is inside the pool (all of it counts), contains it (the whole pool), or
    misses it."""
    same: list[Any] = [n for n in reserved if n.version == pool.version]  # one family: comparable
    total = 0
    for net in ipaddress.collapse_addresses(same):
        if net.subnet_of(pool):
            total += net.num_addresses
        elif pool.subnet_of(net):
            return int(pool.num_addresses)
    return int(total)


def reserved_family(pools: Mapping[str, IPNetwork], reserved: Iterable[IPNetwork]) -> Metric:
    fam = GaugeMetricFamily(
        m.IPAM_POOL_RESERVED,
        "Addresses in the IP pool that an IPReservation covers, and so cannot be assigned.",
        labels=[m.LABEL_POOL],
    )
    nets = tuple(reserved)
    for name, net in sorted(pools.items()):
        fam.add_metric([name], reserved_in(net, nets))
    return fam


# -- the legacy per-node gauges -----------------------------------------------------------------------------


def _by_node(values: Mapping[PoolNode, int], skip: str | None = None) -> Counter[str]:
    out: Counter[str] = Counter()
    for (_pool, node), v in values.items():
        if node != skip and v:
            out[node] += v
    return out


def legacy_families(
    in_use: Mapping[PoolNode, int], borrowed: Mapping[PoolNode, int], blocks: Mapping[PoolNode, int]
) -> Iterator[Metric]:
    """Calico's legacy per-node gauges from the per-(pool, node) totals (see the module docstring)."""
    series = (
        (m.IPAM_LEGACY_ALLOCATIONS, "Number of IPs allocated", _by_node(in_use, skip=m.UNKNOWN_NODE)),
        (
            m.IPAM_LEGACY_BORROWED,
            "Number of allocated IPs that are from non-affine blocks.",
            _by_node(borrowed),
        ),
        (m.IPAM_LEGACY_BLOCKS, "Number of blocks in IPAM", _by_node(blocks)),
    )
    for name, doc, values in series:
        fam = GaugeMetricFamily(name, doc, labels=[m.LABEL_NODE])
        for node, v in sorted(values.items()):
            fam.add_metric([node], v)
        yield fam
