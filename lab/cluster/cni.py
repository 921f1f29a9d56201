"""A Calico CNI IPAM plugin for the simulated cluster: it changes the cluster as Calico's IPAM library does.

Every write goes through the same API store the watcher reads, with resourceVersion compare-and-swap and
up to 100 retries on conflict, in libcalico-go's order: claim a block (BlockAffinity `pending` → IPAMBlock
with `host:` affinity → BlockAffinity `confirmed`), increment the IPAMHandle, then write the block; on
release, write the block first and decrement the handle after (spec §1, §3.13).  With an IP cooldown
(`IPAMConfig.spec.ipCooldownSeconds`, Calico 3.33) a release parks the ordinals and every block it writes
is normalized first, so a cooling IP is never handed out again before its cooldown is over.

This module decides which block and which ordinal an IP gets and takes them back; the IPAMHandle
counts it keeps on the way are :mod:`lab.cluster.cnihandles`.
"""

from __future__ import annotations

import collections
import ipaddress
import threading
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from lab.cluster.cniapi import MAX_CAS_ATTEMPTS, ObjectApi, error_code, soft_delete
from lab.cluster.cnihandles import HandleBook
from shared import blockops
from shared.calicogroup import V1, CalicoGroup
from shared.ipamconfig import CONFIG_NAME, parse_ipam_config
from shared.names import affinity_labels, affinity_name
from shared.netaddr import IPNetwork, cidr_to_name, parse_ip


class PoolExhausted(Exception):
    """No free address in the pool, not even to borrow."""


class CalicoCNI:
    """Assigns and releases pod and tunnel IPs through the API, as Calico's CNI and calico-node do."""

    def __init__(
        self,
        api: ObjectApi,
        pools: list[tuple[str, int]],
        clock_ns: Callable[[], int],
        api_error: type[Exception],
        calico: CalicoGroup = V1,
    ) -> None:
        self.api = api
        self.calico = calico  # the group the API serves Calico's objects in
        self.pools: list[tuple[IPNetwork, int]] = [(ipaddress.ip_network(c), p) for c, p in pools]
        self.clock_ns = clock_ns
        self.api_error = api_error
        self._lock = threading.RLock()
        self._node_blocks: dict[tuple[str, int], list[str]] = {}  # (node, version) → block CIDRs
        self._known: set[str] = set()  # block CIDRs believed to exist
        self._cursor: dict[int, int] = {}  # version → next subnet index to try
        self.handles = HandleBook(api, api_error, calico)
        # Blocks deleted by someone else (the collector), told by a store hook that may not take our lock
        # (`block_deleted`): forgotten at the next claim, so their CIDRs can be claimed again.
        self._deleted: collections.deque[str] = collections.deque()
        # What the pool's exhaustion cost (`lab.cluster.nodechurn` reports them): IPs borrowed from another
        # node's block because no block was free, and assignments refused outright (`PoolExhausted`).
        self.borrowed = 0
        self.refused = 0

    # -- blocks ---------------------------------------------------------------------------------------

    def _pool(self, version: int) -> tuple[IPNetwork, int]:
        for net, prefix in self.pools:
            if net.version == version:
                return net, prefix
        raise PoolExhausted(f"no IPv{version} pool")

    def block_deleted(self, cidr: str) -> None:
        """The block `cidr` was deleted (by the collector): free to claim again.  Safe from a store hook."""
        self._deleted.append(cidr)

    def claim_block(self, node: str, version: int = 4) -> str:
        """Claim a free block for `node` (affinity pending → block → affinity confirmed)."""
        with self._lock:
            while self._deleted:
                self.forget_block(self._deleted.popleft())
            net, prefix = self._pool(version)
            total = 1 << (prefix - net.prefixlen)
            start = self._cursor.get(version, 0)
            for step in range(total):
                index = (start + step) % total
                cidr = ipaddress.ip_network(
                    (int(net.network_address) + index * (1 << (net.max_prefixlen - prefix)), prefix)
                )
                if str(cidr) in self._known:
                    continue
                if self._try_claim(node, cidr):
                    self._cursor[version] = index + 1
                    return str(cidr)
            raise PoolExhausted(f"no free block left in {net}")

    def _try_claim(self, node: str, cidr: IPNetwork) -> bool:
        aff_name = affinity_name(node, cidr)
        spec = {"state": "pending", "node": node, "type": "host", "cidr": str(cidr)}
        affinity = {
            "apiVersion": self.calico.api_version,
            "kind": "BlockAffinity",
            "metadata": {"name": aff_name, "labels": affinity_labels(node, cidr)},
            "spec": {**spec, "deleted": self.calico.affinity_deleted(False)},
        }
        try:
            created_aff = self.api.create("blockaffinities", None, affinity)
        except self.api_error as exc:
            if error_code(exc) != 409:
                raise
            created_aff = self.api.get("blockaffinities", None, aff_name)
        now = self.clock_ns()
        block = blockops.new_block_object(cidr, node, now, _rfc3339(now), self.calico)
        try:
            self.api.create("ipamblocks", None, block)
        except self.api_error as exc:
            if error_code(exc) != 409:
                raise
            # Someone else owns this block: drop our pending claim and move on.
            self._known.add(str(cidr))
            self.api.delete("blockaffinities", None, aff_name)
            return False
        created_aff["spec"]["state"] = "confirmed"
        self.api.replace("blockaffinities", None, aff_name, created_aff)
        self._known.add(str(cidr))
        self._node_blocks.setdefault((node, cidr.version), []).append(str(cidr))
        return True

    def adopt(
        self,
        blocks: Iterable[str],
        node_blocks: Mapping[tuple[str, int], list[str]],
        cursor: Mapping[int, int],
    ) -> None:
        """Take over the block bookkeeping of a cluster loaded in bulk."""
        with self._lock:
            self._known.update(blocks)
            for key, cidrs in node_blocks.items():
                self._node_blocks.setdefault(key, []).extend(cidrs)
            self._cursor.update(cursor)

    def forget_block(self, cidr: str) -> None:
        with self._lock:
            self._known.discard(cidr)
            for blocks in self._node_blocks.values():
                if cidr in blocks:
                    blocks.remove(cidr)

    def node_blocks(self, node: str, version: int) -> list[str]:
        with self._lock:
            return list(self._node_blocks.get((node, version), []))

    # -- assignment -----------------------------------------------------------------------------------

    def assign(self, node: str, handle: str, attrs: Mapping[str, str], version: int = 4) -> str:
        """Assign one IP for `handle` on `node`: own blocks, then a new block, then borrow."""
        for cidr in self.node_blocks(node, version):
            ip = self._assign_in(cidr, handle, attrs, owner=node)
            if ip is not None:
                return ip
        try:
            cidr = self.claim_block(node, version)
        except PoolExhausted:
            with self._lock:
                # In address order: a seeded run borrows the same IPs in every process (a set iterates
                # in hash order, which differs from one process to the next).
                nets = [ipaddress.ip_network(c) for c in self._known]
                candidates = [str(n) for n in sorted(n for n in nets if n.version == version)]
            for c in candidates:
                ip = self._assign_in(c, handle, attrs, owner=None)
                if ip is not None:
                    self.borrowed += 1
                    return ip
            self.refused += 1
            raise
        ip = self._assign_in(cidr, handle, attrs, owner=node)
        if ip is None:
            raise PoolExhausted(f"fresh block {cidr} refused an assignment")
        return ip

    def _assign_in(self, cidr: str, handle: str, attrs: Mapping[str, str], owner: str | None) -> str | None:
        name = cidr_to_name(cidr)
        counted = False
        for _ in range(MAX_CAS_ATTEMPTS):
            try:
                block = self.api.get("ipamblocks", None, name)
            except self.api_error as exc:
                if error_code(exc) == 404:
                    self.forget_block(cidr)
                    break
                raise
            spec = block["spec"]
            if spec.get("deleted") or not (spec["unallocated"] or _cooling(spec)):
                break
            if owner is not None and spec.get("affinity") != f"host:{owner}":
                self.forget_block(cidr)
                break
            # The library normalizes every block it reads: cooled IPs go back to `unallocated` first.
            blockops.normalize(spec, self.ip_cooldown(), self.clock_ns() / 1e9)
            if not spec["unallocated"]:
                break  # every free ordinal is still cooling down: never handed out
            if not counted:
                self.handles.change(handle, cidr, +1)
                counted = True
            ordinals = blockops.assign_in_place(spec, handle, attrs)  # `block` is our own copy
            try:
                self.api.replace("ipamblocks", None, name, block)
            except self.api_error as exc:
                if error_code(exc) in (404, 409):
                    continue
                raise
            return blockops.ip_of(block["spec"], ordinals[0])
        if counted:
            self.handles.change(handle, cidr, -1)
        return None

    def ip_cooldown(self) -> int:
        """`IPAMConfig/default`'s `ipCooldownSeconds`, read on every assignment and release as the
        library reads its config (0 when there is none)."""
        try:
            raw = self.api.get("ipamconfigs", None, CONFIG_NAME)
        except self.api_error as exc:
            if error_code(exc) == 404:
                return 0
            raise
        return parse_ipam_config(raw).ip_cooldown_seconds

    # -- the handle's bookkeeping and by-handle calls (:mod:`lab.cluster.cnihandles`) -------------------

    def ips_by_handle(self, handle: str) -> list[str]:
        """The IPs the handle's blocks hold for it (the library's `IPsByHandle`)."""
        return self.handles.ips_by_handle(handle)

    def set_owner_attributes(
        self,
        ip: str,
        handle: str,
        *,
        active: Mapping[str, str] | None = None,
        alternate: Mapping[str, str] | None = None,
        clear_alternate: bool = False,
    ) -> None:
        """The library's `SetOwnerAttributes`: replace the active owner's attributes (`secondary`) and/or
        the alternate owner's (`alternateOwnerAttrs`, a live-migration target) of an IP the handle holds;
        the IP and its ordinal stay (a VM keeps its address across a restart or a migration)."""
        cidr = self._block_cidr_of(parse_ip(ip))
        self.handles.set_owner_attributes(
            cidr, ip, handle, active=active, alternate=alternate, clear_alternate=clear_alternate
        )

    # -- release --------------------------------------------------------------------------------------

    def release_ips(self, handle: str, ips: list[str]) -> list[str]:
        """CNI DEL for known IPs: free them block by block, then decrement the handle."""
        by_block: dict[str, list[str]] = {}
        for ip in ips:
            by_block.setdefault(self._block_cidr_of(parse_ip(ip)), []).append(ip)
        freed: list[str] = []
        for cidr, block_ips in by_block.items():
            freed.extend(self._release_in(cidr, handle, block_ips))
        return freed

    def _block_cidr_of(self, addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
        """Mask the IP with its pool's block size, as the library does."""
        net, prefix = self._pool(addr.version)
        return str(ipaddress.ip_network((int(addr) & ~((1 << (net.max_prefixlen - prefix)) - 1), prefix)))

    def _release_in(self, cidr: str, handle: str, ips: list[str]) -> list[str]:
        name = cidr_to_name(cidr)
        for _ in range(MAX_CAS_ATTEMPTS):
            try:
                block = self.api.get("ipamblocks", None, name)
            except self.api_error as exc:
                if error_code(exc) == 404:
                    return []
                raise
            try:
                requests = [blockops.ReleaseRequest(ip, handle) for ip in ips]
                cooldown, now = self.ip_cooldown(), self.clock_ns() / 1e9
                out = blockops.release(block["spec"], requests, in_place=True, cooldown=cooldown, now=now)
            except blockops.ReleaseConflict:
                return []  # the IP is no longer ours (already released and re-used)
            if not out.written:
                return []
            block["spec"] = out.spec
            try:
                if out.empty and block["spec"].get("affinity") is None:
                    soft_delete(self.api, "ipamblocks", block)
                    self.forget_block(cidr)
                else:
                    self.api.replace("ipamblocks", None, name, block)
            except self.api_error as exc:
                if error_code(exc) in (404, 409):
                    continue
                raise
            for h, n in out.handle_counts.items():
                self.handles.change(h, cidr, -n)
            return out.released
        return []


def _cooling(spec: Mapping[str, Any]) -> bool:
    """Any ordinal parked in cooldown (a write may return it to `unallocated`)."""
    attrs = spec.get("attributes") or []
    return any(a.get("releasedAt") is not None for a in attrs if isinstance(a, Mapping))


def _rfc3339(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
