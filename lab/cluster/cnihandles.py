"""The simulated CNI's IPAMHandle bookkeeping, and its calls keyed by handle (KubeVirt's persistent IPs).

Why a module of its own: Calico's IPAM library counts, in an IPAMHandle per handle, how many ordinals
each block holds for it; an assignment increments that count before it writes the block and a release
decrements it after (spec §1, §3.13), and a handle whose counts reach zero is soft-deleted then deleted.
That bookkeeping is its own object, written with its own compare-and-swap loop, and the GC judges leaks
by it; :class:`~lab.cluster.cni.CalicoCNI` decides which block and ordinal an IP gets and calls
:class:`HandleBook` at those two points.  The library's by-handle calls (`IPsByHandle`,
`SetOwnerAttributes`: a KubeVirt VM keeps its IP across restarts and migrations) read a handle's
blocks through it too.
"""

from __future__ import annotations

from collections.abc import Mapping

from lab.cluster.cniapi import MAX_CAS_ATTEMPTS, ObjectApi, error_code, soft_delete
from shared import blockops
from shared.calicogroup import CalicoGroup
from shared.model import sanitize_handle
from shared.names import handle_name
from shared.netaddr import cidr_to_name, ip_to_ordinal, parse_network

__all__ = ["HandleBook"]


class HandleBook:
    """A handle's per-block counts in its IPAMHandle, and the IPs the handle holds."""

    def __init__(self, api: ObjectApi, api_error: type[Exception], calico: CalicoGroup) -> None:
        self.api = api
        self.api_error = api_error
        self.calico = calico  # the group the API serves Calico's objects in

    def change(self, handle: str, cidr: str, delta: int) -> None:
        """Add `delta` to the handle's count for the block `cidr` (created, or deleted when it empties)."""
        name = handle_name(sanitize_handle(handle))
        for _ in range(MAX_CAS_ATTEMPTS):
            try:
                obj = self.api.get("ipamhandles", None, name)
            except self.api_error as exc:
                if error_code(exc) != 404:
                    raise
                if delta < 0:
                    return  # tolerated, as the library does
                body = {
                    "apiVersion": self.calico.api_version,
                    "kind": "IPAMHandle",
                    "metadata": {"name": name},
                    "spec": {"handleID": handle, "block": {cidr: delta}, "deleted": False},
                }
                try:
                    self.api.create("ipamhandles", None, body)
                    return
                except self.api_error as exc2:
                    if error_code(exc2) == 409:
                        continue
                    raise
            counts: dict[str, int] = obj["spec"].setdefault("block", {})
            counts[cidr] = counts.get(cidr, 0) + delta
            if counts[cidr] <= 0:
                del counts[cidr]
            try:
                if counts:
                    self.api.replace("ipamhandles", None, name, obj)
                else:
                    soft_delete(self.api, "ipamhandles", obj)
                return
            except self.api_error as exc:
                if error_code(exc) in (404, 409):
                    continue
                raise

    # -- owner attributes (KubeVirt: one IP for a VM's life) ---------------------------------------------

    def ips_by_handle(self, handle: str) -> list[str]:
        """The IPs the handle's blocks hold for it (the library's `IPsByHandle`)."""
        try:
            raw = self.api.get("ipamhandles", None, handle_name(sanitize_handle(handle)))
        except self.api_error as exc:
            if error_code(exc) == 404:
                return []
            raise
        out: list[str] = []
        for cidr in sorted((raw.get("spec") or {}).get("block") or {}):
            try:
                spec = self.api.get("ipamblocks", None, cidr_to_name(cidr))["spec"]
            except self.api_error as exc:
                if error_code(exc) == 404:
                    continue
                raise
            attrs = spec.get("attributes") or []
            for o, idx in enumerate(spec.get("allocations") or []):
                if isinstance(idx, int) and 0 <= idx < len(attrs) and attrs[idx].get("handle_id") == handle:
                    out.append(blockops.ip_of(spec, o))
        return out

    def set_owner_attributes(
        self,
        cidr: str,
        ip: str,
        handle: str,
        *,
        active: Mapping[str, str] | None = None,
        alternate: Mapping[str, str] | None = None,
        clear_alternate: bool = False,
    ) -> None:
        """`CalicoCNI.set_owner_attributes` in the block `cidr` that holds `ip`."""
        name = cidr_to_name(cidr)
        for _ in range(MAX_CAS_ATTEMPTS):
            block = self.api.get("ipamblocks", None, name)
            spec = block["spec"]
            ordinal = ip_to_ordinal(parse_network(str(spec["cidr"])), ip)
            idx = (spec.get("allocations") or [])[ordinal]
            attrs = spec.get("attributes") or []
            if not isinstance(idx, int) or attrs[idx].get("handle_id") != handle:
                raise ValueError(f"{ip} is not assigned to handle {handle}")
            # An attribute entry may be shared by several ordinals: give this one its own.
            entry = dict(attrs[idx])
            if active is not None:
                entry["secondary"] = dict(active)
            if alternate is not None:
                entry["alternateOwnerAttrs"] = dict(alternate)
            if clear_alternate:
                entry.pop("alternateOwnerAttrs", None)
            shared = sum(1 for i in spec["allocations"] if i == idx) > 1
            if shared:
                attrs.append(entry)
                spec["allocations"][ordinal] = len(attrs) - 1
            else:
                attrs[idx] = entry
            spec["attributes"] = attrs
            try:
                self.api.replace("ipamblocks", None, name, block)
                return
            except self.api_error as exc:
                if error_code(exc) == 409:
                    continue
                raise
        raise RuntimeError(f"set owner attributes of {ip}: too many conflicts")
