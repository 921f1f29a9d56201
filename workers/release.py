"""Release IPs as Calico's IPAM library does (`ReleaseIPs`, spec §3.13): per block, conditionally.

For each block: GET it (absent or soft-deleted: every request of it is already free); apply
`shared.blockops.release` with each request's (ip, handle, sequence number) — all or nothing per block;
write the result back with the resourceVersion read (409: re-read and re-evaluate, up to 100 times as
the library does); an unaffine block that becomes empty — Windows-reserved ordinals aside, as the library
counts (`blockops.deleted_by_release`) — is soft-deleted (`deleted: true` by a conditional replace) and
then deleted with preconditions (uid + resourceVersion).  Only after the block write, each
IPAMHandle's per-block count is decremented (CAS; the handle is soft-deleted and deleted when its map
empties; a missing handle is tolerated, #3940; failures are only logged, as the library does).

A `ReleaseConflict` (bad sequence number or handle) means the IP was re-used or the decision is stale:
that request is dropped — never retried as is; the watcher re-dirties the allocation from the new block
state — and the block's other requests go ahead.  Every Kubernetes write is preceded by `guard()` (the
leader's fence).  A handle decrement completes a block write already made under the fence and is itself
a CAS, so it is not fenced again: skipping it would leave the handle's count wrong for good.

Also here, because it is the last step before a release: `Rechecker`, Calico's final re-validation
against the live API (§3.9), and `TokenBucket`, the releases-per-second limit.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import redis

from shared import blockops
from shared.codec import RecordError
from shared.errors import BadPodIP, MalformedObject
from shared.keys import Keys, pod_key
from shared.model import ATTR_NAMESPACE, ATTR_POD, ATTR_VMI_NAME, Allocation, IPAMBlock, Pod, sanitize_handle
from shared.names import handle_name
from shared.netaddr import AddressError, cidr_to_name, ip_to_ordinal, ordinal_to_ip
from shared.parse import parse_block, parse_handle, parse_pod
from shared.records import decode_pod, gc_attrs
from shared.rules import AllocationType, KubeVirtView, Lookup, PodView, allocation_validity, classify
from workers.audit import Result
from workers.kube import ApiUnavailable, Conflict, JsonObj, KubeError, NotFound

log = logging.getLogger(__name__)

# libcalico-go's `datastoreRetries`: compare-and-swap attempts per object before giving up.
MAX_CAS_ATTEMPTS = 100
BLOCKS = "ipamblocks"
HANDLES = "ipamhandles"
VMS = "virtualmachines"  # kubevirt.io/v1
VMIS = "virtualmachineinstances"


class ObjectApi(Protocol):
    """What the leader needs from the API (`workers.kube.CalicoApi`)."""

    def get(self, plural: str, name: str) -> JsonObj: ...
    def replace(self, plural: str, body: JsonObj) -> JsonObj: ...
    def delete(self, plural: str, name: str, uid: str, resource_version: str) -> None: ...
    def list(self, plural: str, label_selector: str) -> list[JsonObj]: ...
    def get_node(self, name: str) -> JsonObj: ...
    def get_pod(self, namespace: str, name: str) -> JsonObj: ...
    def kubevirt_installed(self) -> bool: ...
    def get_kubevirt(self, plural: str, namespace: str, name: str) -> JsonObj: ...


@dataclass(frozen=True, slots=True)
class Request:
    key: str  # the caller's id for it (the decision's stream id)
    ip: str
    handle: str
    sequence_number: int
    block: str  # block CIDR
    # The allocation's GC attributes as decided on (the mirror's): the live block must hold the same, or
    # the re-check judged another owner than the IP's (a forged or corrupt mirror record).
    attrs: Mapping[str, str] | None = None

    def blockops(self) -> blockops.ReleaseRequest:
        return blockops.ReleaseRequest(self.ip, self.handle, self.sequence_number)


@dataclass(frozen=True, slots=True)
class Outcome:
    result: Result  # RELEASED, ALREADY_FREE, REFUSED_CONFLICT or ERROR
    reason: str


def soft_delete_and_delete(api: ObjectApi, plural: str, obj: JsonObj, guard: Callable[[], None]) -> None:
    """Calico's compare-and-delete on Kubernetes: `deleted: true` under resourceVersion CAS, then delete
    by uid + the resourceVersion of that write.  Conflict/NotFound propagate to the caller's retry."""
    body = blockops.json_copy(obj)
    body["spec"]["deleted"] = True
    guard()
    written = api.replace(plural, body)
    meta = written.get("metadata") or {}
    name = str(meta.get("name") or obj["metadata"]["name"])
    guard()
    try:
        api.delete(plural, name, str(meta.get("uid") or ""), str(meta.get("resourceVersion") or ""))
    except NotFound:
        pass  # already gone: what we wanted
    except Conflict:
        # Written between our two calls: the soft-deleted object is already absent to every reader.
        log.warning("%s/%s changed after its soft delete; left soft-deleted", plural, name)


class BlockReleaser:
    """One pass of releases.  `read` fetches blocks (cached for the first write attempt), `conflicts`
    tells which requests a block refuses, `release` writes."""

    def __init__(
        self,
        api: ObjectApi,
        guard: Callable[[], None],
        attempts: int = MAX_CAS_ATTEMPTS,
        *,
        cooldown: int = 0,
        now: float | None = None,
    ) -> None:
        self.api = api
        self.guard = guard
        self.attempts = attempts
        # IPAMConfig `ipCooldownSeconds` (> 0: released ordinals are parked, `shared.blockops`) and the
        # wall time their `releasedAt` says; with `now`, every written block is normalized as the library's.
        self.cooldown = cooldown
        self.now = now
        self._blocks: dict[str, JsonObj | None] = {}
        # Each live block as read, parsed once (`_get`): the checks of a pass (handle all-or-none, the
        # live attributes of each IP) read it, not three parses of the same JSON per released IP.
        self._parsed: dict[int, tuple[JsonObj, IPAMBlock]] = {}
        # IPAMHandles read by `handle_others`, reused by the decrement after the block write (its PUT is
        # conditional on this read's resourceVersion: a handle changed since is re-read on the 409).
        self._handles: dict[str, JsonObj] = {}

    def _get(self, cidr: str) -> JsonObj | None:
        """The live block, or None when it does not exist (or is soft-deleted: treated as absent)."""
        try:
            obj = self.api.get(BLOCKS, cidr_to_name(cidr))
        except NotFound:
            return None
        parsed = parse_block(obj)  # MalformedObject: never written from
        if obj["spec"].get("deleted"):
            return None
        # Keyed by the object, which is held with it (so its id cannot be reused): a re-read block is
        # parsed anew.
        self._parsed[id(obj)] = (obj, parsed)
        return obj

    def _typed(self, obj: JsonObj) -> IPAMBlock:
        held = self._parsed.get(id(obj))
        return held[1] if held is not None and held[0] is obj else parse_block(obj)

    def read(self, cidrs: Iterable[str]) -> None:
        """Fetch blocks; one that cannot be read is not cached (`release` reads it again and reports)."""
        for cidr in sorted(set(cidrs) - set(self._blocks)):
            try:
                self._blocks[cidr] = self._get(cidr)
            except (MalformedObject, KubeError) as exc:
                log.warning("block not readable: %s", exc, extra={"block": cidr})

    def conflicts(self, requests: Iterable[Request]) -> dict[str, str]:
        """key → why, for every request whose block (as read) refuses it; unread blocks are read."""
        reqs = list(requests)
        self.read(r.block for r in reqs)
        out: dict[str, str] = {}
        for r in reqs:
            obj = self._blocks.get(r.block)
            if obj is None:
                continue
            try:
                blockops.release(obj["spec"], [r.blockops()])
            except blockops.ReleaseConflict as exc:
                out[r.key] = str(exc)
                continue
            live = _live_attrs(self._typed(obj), r.ip)
            if r.attrs is not None and live is not None and live != dict(r.attrs):
                out[r.key] = f"attributes of {r.ip} in the live block are {live}, not {dict(r.attrs)}"
        return out

    def handle_others(self, handle: str, ips: set[str]) -> list[str]:
        """IPs other than `ips` that the live blocks hold for `handle` (all-or-none, #5044, checked on
        the API rather than on the mirror's handle index): the blocks its IPAMHandle names, read live.
        A missing IPAMHandle (#3940) names none.  MalformedObject/KubeError propagate."""
        name = handle_name(sanitize_handle(handle))
        try:
            obj = self.api.get(HANDLES, name)
        except NotFound:
            return []
        cidrs = sorted(parse_handle(obj).block)
        self._handles[name] = obj
        self.read(cidrs)
        others: list[str] = []
        for cidr in cidrs:
            block = self._blocks.get(cidr)
            if block is None and cidr not in self._blocks:
                raise ApiUnavailable(f"block {cidr} of handle {handle} could not be read")
            if block is None:
                continue
            for a in self._typed(block).iter_allocations():
                if sanitize_handle(a.handle) == sanitize_handle(handle) and a.ip not in ips:
                    others.append(a.ip)
        return others

    def release(self, requests: Iterable[Request]) -> dict[str, Outcome]:
        by_block: dict[str, list[Request]] = {}
        for r in requests:
            by_block.setdefault(r.block, []).append(r)
        out: dict[str, Outcome] = {}
        for cidr, reqs in sorted(by_block.items()):
            out.update(self._release_block(cidr, reqs))
        return out

    def _release_block(self, cidr: str, reqs: list[Request]) -> dict[str, Outcome]:
        extra = {"block": cidr}
        out: dict[str, Outcome] = {}
        pending = list(reqs)
        try:
            obj = self._blocks.pop(cidr) if cidr in self._blocks else self._get(cidr)
            for _ in range(self.attempts):
                if obj is None:
                    out.update({r.key: Outcome(Result.ALREADY_FREE, "block not found") for r in pending})
                    return out
                outcome, pending = self._apply(obj["spec"], pending, out, self.cooldown, self.now)
                if outcome is None:
                    return out
                if not outcome.written:
                    out.update({r.key: Outcome(Result.ALREADY_FREE, "ordinal already free") for r in pending})
                    return out
                body = {**obj, "spec": outcome.spec}
                try:
                    if outcome.deletes_block:
                        soft_delete_and_delete(self.api, BLOCKS, body, self.guard)
                    else:
                        self.guard()
                        self.api.replace(BLOCKS, body)
                except (Conflict, NotFound) as exc:
                    log.info("block changed under the release, re-reading: %s", exc, extra=extra)
                    obj = self._get(cidr)
                    continue
                freed = set(outcome.released)
                for r in pending:
                    if r.ip in freed:
                        out[r.key] = Outcome(Result.RELEASED, "released")
                    else:
                        out[r.key] = Outcome(Result.ALREADY_FREE, "ordinal already free")
                self._decrement_handles(cidr, outcome.handle_counts)
                return out
        except MalformedObject as exc:
            log.error("block unreadable, nothing released from it: %s", exc, extra=extra)
            out.update({r.key: Outcome(Result.ERROR, f"block unreadable: {exc}") for r in pending})
            return out
        except KubeError as exc:
            log.warning("release from block failed: %s", exc, extra=extra)
            out.update({r.key: Outcome(Result.ERROR, str(exc)) for r in pending})
            return out
        out.update({r.key: Outcome(Result.ERROR, "too many conflicts") for r in pending})
        return out

    @staticmethod
    def _apply(
        spec: blockops.Spec,
        pending: list[Request],
        out: dict[str, Outcome],
        cooldown: int = 0,
        now: float | None = None,
    ) -> tuple[blockops.ReleaseOutcome | None, list[Request]]:
        """Release what the block accepts; refused requests go to `out` as conflicts (dropped)."""
        while pending:
            try:
                requests = [r.blockops() for r in pending]
                return blockops.release(spec, requests, cooldown=cooldown, now=now), pending
            except blockops.ReleaseConflict:
                kept = []
                for r in pending:
                    try:
                        blockops.release(spec, [r.blockops()])
                        kept.append(r)
                    except blockops.ReleaseConflict as exc:
                        out[r.key] = Outcome(Result.REFUSED_CONFLICT, str(exc))
                pending = kept
        return None, pending

    def _decrement_handles(self, cidr: str, counts: Mapping[str, int]) -> None:
        for handle, n in sorted(counts.items()):
            try:
                read = self._handles.pop(handle_name(sanitize_handle(handle)), None)
                decrement_handle(self.api, handle, cidr, n, self.attempts, read=read)
            except (KubeError, MalformedObject, HandleCountMismatch) as exc:
                log.warning("handle count not decremented: %s", exc, extra={"handle": handle, "block": cidr})


def _live_attrs(block: IPAMBlock, ip: str) -> dict[str, str] | None:
    """The GC attributes the live block holds for `ip` (None: the ordinal is free or has no handle, or
    `ip` is not in the block)."""
    try:
        ordinal = ip_to_ordinal(block.cidr, ip)
    except AddressError:
        return None
    if ordinal >= len(block.allocations) or str(ordinal_to_ip(block.cidr, ordinal)) != ip:
        return None  # as the ordinal's own IP, written as the block writes it, or not at all
    index = block.allocations[ordinal]
    if index is None:
        return None
    attr = block.attributes[index]
    return None if attr.handle_id is None else gc_attrs(attr.secondary)


class HandleCountMismatch(ValueError):
    """The handle has no entry for the block, or fewer addresses than released: Calico's library errors
    and leaves the handle as it is; so do we (the block write already happened)."""


# A decrement whose read failed, or whose write the API refused without processing it (429 throttled,
# 503 unavailable), is repeated a few times with back-off: given up at once, the handle would count the
# released IPs for good.  Any other failed write (500, 504, a dropped connection) may have been applied, so
# it is not repeated (a second decrement could under-count), only logged, as the library does.
UNPROCESSED_STATUSES = frozenset({429, 503})
TRANSIENT_RETRIES = 6
TRANSIENT_BACKOFF_SECONDS = 0.02  # doubled per retry: 1.3 s at most in all


def decrement_handle(
    api: ObjectApi,
    handle: str,
    cidr: str,
    n: int,
    attempts: int = MAX_CAS_ATTEMPTS,
    sleep: Callable[[float], None] = time.sleep,
    *,
    read: JsonObj | None = None,
) -> None:
    """IPAMHandle `handle` holds `n` fewer addresses in `cidr`; deleted (soft, then preconditioned) when
    it holds none.  A missing or soft-deleted handle is tolerated (#3940); an entry missing or smaller
    than `n` raises HandleCountMismatch and leaves the handle untouched, as Calico's library does.
    `read`: the handle as read earlier in this pass, used for the first attempt instead of a GET (the
    write is conditional on its resourceVersion, so a handle changed since costs a 409 and a re-read)."""
    name = handle_name(sanitize_handle(handle))
    transient = 0
    for _ in range(attempts):
        try:
            obj = read if read is not None else api.get(HANDLES, name)
            read = None
        except NotFound:
            log.info("no IPAMHandle to decrement", extra={"handle": handle, "block": cidr})
            return
        except ApiUnavailable:
            if transient >= TRANSIENT_RETRIES:
                raise
            transient += 1
            sleep(TRANSIENT_BACKOFF_SECONDS * 2**transient)
            continue
        parse_handle(obj)  # MalformedObject (logged by the caller): never written from, left as it is
        spec: dict[str, Any] = dict(obj.get("spec") or {})
        if spec.get("deleted"):
            return
        counts = {str(k): int(v) for k, v in (spec.get("block") or {}).items()}
        left = counts.get(cidr, 0) - n
        if cidr not in counts or left < 0:
            # The library's decrementBlock: an error, the handle left as it is (logged by the caller).
            have = counts.get(cidr)
            raise HandleCountMismatch(f"IPAMHandle {name} holds {have} address(es) in {cidr}, not {n}")
        if left > 0:
            counts[cidr] = left
        else:
            counts.pop(cidr, None)
        body = {**obj, "spec": {**spec, "block": counts}}
        try:
            if counts:
                api.replace(HANDLES, body)
            else:
                soft_delete_and_delete(api, HANDLES, body, lambda: None)
            return
        except (Conflict, NotFound):
            continue
        except ApiUnavailable as exc:
            if exc.status not in UNPROCESSED_STATUSES or transient >= TRANSIENT_RETRIES:
                raise
            transient += 1
            sleep(TRANSIENT_BACKOFF_SECONDS * 2**transient)
    log.warning("IPAMHandle still conflicting after %s attempts", attempts, extra={"handle": handle})


class TokenBucket:
    """Releases per second (Calico has none for releases, only its client QPS): `rate` tokens a second,
    up to `burst`; rate 0 is unlimited."""

    def __init__(
        self, rate: float, burst: float | None = None, monotonic: Callable[[], float] = time.monotonic
    ):
        self.rate = rate
        self.burst = max(1.0, burst if burst is not None else rate)
        self.monotonic = monotonic
        self._tokens = self.burst
        self._at = monotonic()

    def _refill(self) -> None:
        now = self.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now

    def take(self, n: int) -> bool:
        """Take `n` tokens if there are enough (a request larger than the burst waits for a full bucket)."""
        if self.rate <= 0:
            return True
        self._refill()
        need = min(float(n), self.burst)
        if self._tokens + 1e-9 < need:
            return False
        self._tokens -= need
        return True

    def wait_for(self, n: int) -> float:
        """Seconds until `take(n)` can succeed."""
        if self.rate <= 0:
            return 0.0
        self._refill()
        need = min(float(n), self.burst)
        return max(0.0, (need - self._tokens) / self.rate)


# -- the last look before a release (spec §3.9) --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Recheck:
    valid: bool  # in use (or cannot be judged): never release
    reason: str  # a `shared.rules.Reason` value
    evidence: dict[str, Any]
    error: str | None = None  # the API could not answer: keep the decision and look again later


class Rechecker:
    """Calico's final re-validation right before `ReleaseIPs`, with the live API as the source.

    The node of an allocation (its `node` attribute) is looked up live, once per pass.  Node present →
    the pod is read live (NotFound → missing; any other error → `error`, counted valid).  Node gone
    (an authoritative 404) → the mirrored pod is good enough, as Calico uses its cache then; tunnel IPs are
    decided by that live node lookup, so a node re-created under the same name keeps its tunnel IP (§8.4).
    """

    def __init__(self, api: ObjectApi, client: redis.Redis, keys: Keys) -> None:
        self.api = api
        self.redis = client
        self.keys = keys
        self._nodes: dict[str, str] = {}
        self._kubevirt: bool | None = None  # KubeVirt installed (discovered once per pass)

    def _vm_view(self, namespace: str, name: str) -> KubeVirtView | None:
        """The VM rule's view of one VM, read live: None when KubeVirt is not installed (§3.8: valid).
        KubeError propagates (the decision waits)."""
        if self._kubevirt is None:
            self._kubevirt = self.api.kubevirt_installed()
        if not self._kubevirt:
            return None
        key = (namespace, name)
        try:
            self.api.get_kubevirt(VMS, namespace, name)
            return KubeVirtView(frozenset({key}), {})
        except NotFound:
            pass
        try:
            vmi = self.api.get_kubevirt(VMIS, namespace, name)
        except NotFound:
            return KubeVirtView(frozenset(), {})
        return KubeVirtView(frozenset(), {key: vmi_owned_by_vm(vmi)})

    def _node(self, name: str) -> str:
        state = self._nodes.get(name)
        if state is None:
            try:
                self.api.get_node(name)
                state = "exists"
            except NotFound:
                state = "gone"
            self._nodes[name] = state
        return state

    def _mirrored_pod(self, namespace: str, name: str) -> PodView:
        raw = self.redis.hget(self.keys.pods, pod_key(namespace, name))
        if not isinstance(raw, bytes):
            return Lookup.MISSING
        try:
            return decode_pod(namespace, name, raw)
        except RecordError:
            return Lookup.UNKNOWN

    def check(self, a: Allocation) -> Recheck:
        kind = classify(a)
        ev: dict[str, Any] = {"type": str(kind)}
        if kind in (AllocationType.RESERVED, AllocationType.UNKNOWN):
            return Recheck(True, "unknown-source", ev)
        try:
            state = self._node(a.node)
        except KubeError as exc:
            return Recheck(False, "", {**ev, "node": "unknown"}, error=f"node lookup failed: {exc}")
        ev["node"] = state
        exists = state == "exists"
        pod: PodView = Lookup.UNKNOWN
        ns, name = a.attrs.get(ATTR_NAMESPACE, ""), a.attrs.get(ATTR_POD, "")
        if kind is not AllocationType.TUNNEL and ns and name:
            if exists:
                ev["pod_source"] = "live"
                try:
                    pod = parse_pod(self.api.get_pod(ns, name))
                except NotFound:
                    pod = Lookup.MISSING
                except BadPodIP as exc:  # judged with its IPs unparsed, as the workers judged it
                    pod = exc.pod if isinstance(exc.pod, Pod) else Lookup.UNKNOWN
                except MalformedObject:
                    pod = Lookup.UNKNOWN
                except KubeError as exc:
                    return Recheck(False, "", ev, error=f"pod lookup failed: {exc}")
            else:
                ev["pod_source"] = "mirror"
                pod = self._mirrored_pod(ns, name)
            ev["pod"] = _pod_evidence(pod)
        kubevirt: KubeVirtView | Lookup | None = None
        if kind is AllocationType.VM:
            vmi = a.attrs.get(ATTR_VMI_NAME, "")
            if ns and vmi:
                try:
                    kubevirt = self._vm_view(ns, vmi)
                except MalformedObject:
                    kubevirt = Lookup.UNKNOWN
                except KubeError as exc:
                    return Recheck(False, "", ev, error=f"VM lookup failed: {exc}")
                ev["kubevirt"] = _vm_evidence(kubevirt, (ns, vmi))
        validity = allocation_validity(a, a.node if exists else "", pod, kubevirt)
        ev["valid"], ev["reason"] = validity.valid, str(validity.reason)
        return Recheck(validity.valid, str(validity.reason), ev)


def vmi_owned_by_vm(vmi: JsonObj) -> bool:
    """Calico's `hasVMOwner`: an ownerReference of kind VirtualMachine.  MalformedObject if unreadable."""
    meta = vmi.get("metadata")
    if not isinstance(meta, dict):
        raise MalformedObject("VirtualMachineInstance", "", "metadata is not an object")
    refs = meta.get("ownerReferences") or []
    if not isinstance(refs, list):
        raise MalformedObject(
            "VirtualMachineInstance", str(meta.get("name") or ""), "ownerReferences is not a list"
        )
    return any(isinstance(r, dict) and r.get("kind") == "VirtualMachine" for r in refs)


def _vm_evidence(view: KubeVirtView | Lookup | None, key: tuple[str, str]) -> str:
    if view is None:
        return "kubevirt-absent"
    if isinstance(view, Lookup):
        return view.value
    if key in view.vms:
        return "vm-found"
    owned = view.vmis_owned_by_vm.get(key)
    return "no-vm-no-vmi" if owned is None else ("vmi-owned-by-deleted-vm" if owned else "vmi-standalone")


def _pod_evidence(pod: PodView) -> dict[str, str]:
    if isinstance(pod, Lookup):
        return {"lookup": pod.value}
    ips = ",".join(pod.pod_ips or ((pod.pod_ip,) if pod.pod_ip else ()))
    return {"lookup": "found", "uid": pod.uid, "node": pod.node_name, "phase": pod.phase, "ips": ips}
