"""Calico's IPPools as the metrics label them: which pool a block or an IP belongs to.

Why a module: both the incremental tally (`producer/tally.py`) and the refresh's reading of Redis
(`producer/metrics_reading.py`) map CIDRs and IPs to the pool label Calico exposes them under, and the pools
are listed (a handful of raw objects, `list` in the chosen Calico group, not worth a watch) at every refresh.
A block maps to the most specific pool containing it; none: `no_ippool`.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from producer.kube import KubeApi, list_calico_items
from shared import metrics_names as m
from shared.netaddr import AddressError, IPNetwork, parse_network

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, order=True)
class IPPool:
    name: str
    network: IPNetwork

    @property
    def size(self) -> int:
        return int(self.network.num_addresses)


def parse_ippools(items: Iterable[object]) -> tuple[IPPool, ...]:
    """Pools from raw IPPool objects; one being deleted counts as gone (§1.1), a malformed one is skipped."""
    pools = []
    for raw in items:
        meta = raw.get("metadata") if isinstance(raw, dict) else None
        spec = raw.get("spec") if isinstance(raw, dict) else None
        if not isinstance(meta, dict) or not isinstance(spec, dict) or meta.get("deletionTimestamp"):
            continue
        name, cidr = meta.get("name"), spec.get("cidr")
        try:
            if isinstance(name, str) and name and isinstance(cidr, str):
                pools.append(IPPool(name, parse_network(cidr, strict=False)))
                continue
        except AddressError:
            pass
        log.warning("IPPool %r with unreadable cidr %r left out of the metrics", name, cidr)
    return tuple(sorted(pools))


def list_ippools(api: KubeApi, timeout: tuple[float, float] = (10.0, 30.0)) -> tuple[IPPool, ...]:
    """Every IPPool (`list ippools` in the chosen Calico group, raw JSON, no client models)."""
    return parse_ippools(list_calico_items(api, "ippools", timeout))


def pool_of_network(net: IPNetwork, pools: Iterable[IPPool]) -> str:
    """The most specific pool containing `net` (pools do not overlap in Calico), else `no_ippool`."""
    best: IPPool | None = None
    for p in pools:
        contains = p.network.version == net.version and net.subnet_of(p.network)  # type: ignore[arg-type]
        if contains and (best is None or p.network.prefixlen > best.network.prefixlen):
            best = p
    return best.name if best is not None else m.NO_IPPOOL


def pool_of_block(cidr: str, pools: Iterable[IPPool]) -> str:
    try:
        return pool_of_network(parse_network(cidr), pools)
    except AddressError:
        return m.NO_IPPOOL


def pool_of_ip(ip: str, pools: Iterable[IPPool]) -> str:
    try:
        return pool_of_network(ipaddress.ip_network(ip), pools)
    except ValueError:
        return m.NO_IPPOOL
