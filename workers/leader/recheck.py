"""The last look before a release (spec §3.9): Calico's final re-validation against the live API.

Its own module because it only reads and judges — the live node, pod and KubeVirt VM of an allocation,
through the pure rules — while `workers.leader.release` writes: the leader releases nothing this refuses, and
`ipamgc release` (`workers.leader.report_release`) runs the same look on a report's entries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

from kubeio.errors import KubeError, NotFound
from shared.allocrules import allocation_validity, classify
from shared.codec import RecordError
from shared.errors import BadPodIP, MalformedObject
from shared.keys import Keys, pod_key
from shared.model import ATTR_NAMESPACE, ATTR_POD, ATTR_VMI_NAME, Allocation, Pod
from shared.parse import parse_pod
from shared.records import decode_pod
from shared.verdicts import AllocationType, KubeVirtView, Lookup, PodView
from workers.leader.calico_objects import VMIS, VMS, ObjectApi
from workers.leader.kube import JsonObj


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
        # Node present: the pod was read live, and is judged as Calico judges a live read (its deletion
        # timestamp and status.reason seen); node gone: the mirror's pod, judged as Calico's cache.
        validity = allocation_validity(a, a.node if exists else "", pod, kubevirt, live=exists)
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
