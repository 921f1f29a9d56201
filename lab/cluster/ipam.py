"""An in-memory Calico IPAM that writes exactly the objects Calico's IPAM library writes.

It claims blocks for nodes (BlockAffinity with its labels, IPAMBlock with `host:` affinity and a creation-
time sequence number), assigns from the head of `unallocated`, keeps IPAMHandle per-block counts, borrows
from other nodes' blocks when a node's own are full, and releases as the library does.  The snapshot
examples, the unit tests and the simulated CNI plugin all build their clusters with it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from shared import blockops
from shared.calicogroup import V1, CalicoGroup
from shared.names import affinity_labels, affinity_name, handle_name
from shared.netaddr import IPNetwork, parse_ip

WINDOWS_RESERVED_HANDLE = "windows-reserved-ipam-handle"
WINDOWS_NOTE = {"note": "windows host rsvd"}


class PoolExhausted(Exception):
    """No free address left in the pool for this request."""


@dataclass
class Pool:
    cidr: IPNetwork
    block_prefix: int
    next_block: int = 0

    def blocks(self) -> Iterator[IPNetwork]:
        yield from self.cidr.subnets(new_prefix=self.block_prefix)


@dataclass
class CalicoIPAM:
    """Blocks, handles and affinities, as JSON objects keyed by object name."""

    pools: list[Pool] = field(default_factory=list)
    blocks: dict[str, dict[str, Any]] = field(default_factory=dict)  # by block CIDR string
    handles: dict[str, dict[str, Any]] = field(default_factory=dict)  # by handle object name
    affinities: dict[str, dict[str, Any]] = field(default_factory=dict)  # by affinity object name
    clock_ns: int = 1_737_481_904_000_000_000
    claim_time: str = "2025-01-21T17:51:44Z"
    calico: CalicoGroup = V1  # the group the objects are written for
    _by_node: dict[tuple[str, int], list[str]] = field(default_factory=dict)  # (node, version) → CIDRs
    _cursor: dict[int, int] = field(default_factory=dict)  # version → next block index to try

    @classmethod
    def with_pools(cls, v4: str = "10.244.0.0/16", v6: str | None = "fd00:10:244::/112") -> CalicoIPAM:
        pools = [Pool(ipaddress.ip_network(v4), 26)]
        if v6:
            pools.append(Pool(ipaddress.ip_network(v6), 122))
        return cls(pools=pools)

    def _tick(self) -> int:
        self.clock_ns += 1_000_000
        return self.clock_ns

    def _pool(self, version: int) -> Pool:
        for p in self.pools:
            if p.cidr.version == version:
                return p
        raise PoolExhausted(f"no IPv{version} pool")

    # -- blocks and affinities ------------------------------------------------------------------------

    def claim_block(self, node: str, version: int = 4) -> str:
        """Claim the next unused block of the pool for `node`; returns its CIDR string."""
        pool = self._pool(version)
        size = 1 << (pool.cidr.max_prefixlen - pool.block_prefix)
        total = 1 << (pool.block_prefix - pool.cidr.prefixlen)
        start = self._cursor.get(version, 0)
        for step in range(total):
            index = (start + step) % total
            cidr = ipaddress.ip_network((int(pool.cidr.network_address) + index * size, pool.block_prefix))
            if str(cidr) in self.blocks:
                continue
            self._cursor[version] = index + 1
            obj = blockops.new_block_object(cidr, node, self._tick(), self.claim_time, self.calico)
            self.blocks[str(cidr)] = obj
            self._by_node.setdefault((node, version), []).append(str(cidr))
            name = affinity_name(node, cidr)
            self.affinities[name] = {
                "apiVersion": self.calico.api_version,
                "kind": "BlockAffinity",
                "metadata": {"name": name, "labels": affinity_labels(node, cidr)},
                "spec": {
                    "state": "confirmed",
                    "node": node,
                    "type": "host",
                    "cidr": str(cidr),
                    "deleted": self.calico.affinity_deleted(False),
                },
            }
            return str(cidr)
        raise PoolExhausted(f"no free block left in {pool.cidr}")

    def node_blocks(self, node: str, version: int | None = None) -> list[str]:
        versions = (4, 6) if version is None else (version,)
        return [
            c
            for v in versions
            for c in self._by_node.get((node, v), [])
            if c in self.blocks and self.blocks[c]["spec"].get("affinity") == f"host:{node}"
        ]

    # -- assignment ------------------------------------------------------------------------------------

    def assign(
        self, node: str, handle: str, attrs: Mapping[str, str], version: int = 4, borrow: bool = True
    ) -> str:
        """Assign one IP to `handle` from `node`'s blocks, claiming or borrowing as Calico does."""
        target = next(
            (c for c in self.node_blocks(node, version) if self.blocks[c]["spec"]["unallocated"]), None
        )
        if target is None:
            try:
                target = self.claim_block(node, version)
            except PoolExhausted:
                if not borrow:
                    raise
                target = next(
                    (
                        c
                        for c, b in self.blocks.items()
                        if b["spec"]["unallocated"] and ipaddress.ip_network(c).version == version
                    ),
                    None,
                )
                if target is None:
                    raise
        return self.assign_in_block(target, handle, attrs)

    def assign_in_block(self, cidr: str, handle: str, attrs: Mapping[str, str]) -> str:
        block = self.blocks[cidr]
        ordinals = blockops.assign_in_place(block["spec"], handle, attrs)
        self._count_handle(handle, cidr, +1)
        return blockops.ip_of(block["spec"], ordinals[0])

    def reserve_windows(self, cidr: str) -> list[int]:
        """Windows hosts reserve the first three and the last ordinal of each block they claim (no
        IPAMHandle counts them, as in Calico)."""
        spec = self.blocks[cidr]["spec"]
        size = len(spec["allocations"])
        return blockops.reserve_in_place(spec, WINDOWS_RESERVED_HANDLE, WINDOWS_NOTE, [0, 1, 2, size - 1])

    def _count_handle(self, handle: str, cidr: str, delta: int) -> None:
        name = handle_name(handle)
        obj = self.handles.setdefault(
            name,
            {
                "apiVersion": self.calico.api_version,
                "kind": "IPAMHandle",
                "metadata": {"name": name},
                "spec": {"handleID": handle, "block": {}, "deleted": False},
            },
        )
        counts: dict[str, int] = obj["spec"]["block"]
        counts[cidr] = counts.get(cidr, 0) + delta
        if counts[cidr] <= 0:
            del counts[cidr]
        if not counts:
            del self.handles[name]

    # -- release ---------------------------------------------------------------------------------------

    def block_of(self, ip: str) -> str:
        addr = parse_ip(ip)
        for cidr in self.blocks:
            if addr in ipaddress.ip_network(cidr):
                return cidr
        raise KeyError(ip)

    def release(self, ip: str, handle: str | None = None) -> None:
        """Release one IP as the library does (unaffine blocks that empty are deleted)."""
        cidr = self.block_of(ip)
        block = self.blocks[cidr]
        outcome = blockops.release(block["spec"], [blockops.ReleaseRequest(ip, handle)])
        block["spec"] = outcome.spec
        for h, n in outcome.handle_counts.items():
            self._count_handle(h, cidr, -n)
        if outcome.empty and block["spec"].get("affinity") is None:
            del self.blocks[cidr]

    def release_handle(self, handle: str) -> list[str]:
        """CNI DEL: release every IP held by `handle`."""
        freed = []
        for block in list(self.blocks.values()):
            spec = block["spec"]
            for o, idx in enumerate(spec["allocations"]):
                if idx is not None and spec["attributes"][idx].get("handle_id") == handle:
                    freed.append(blockops.ip_of(spec, o))
        for ip in freed:
            self.release(ip, handle)
        return freed

    def objects(self) -> list[dict[str, Any]]:
        return [*self.blocks.values(), *self.handles.values(), *self.affinities.values()]
