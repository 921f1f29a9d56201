"""Raw Kubernetes and Calico objects typed for the mirror; a malformed one becomes what keeps IPs.

Why it exists: the watcher must never crash on, nor release on, an object it cannot read.  `convert`
types one raw object with `shared.parse` (pods, nodes, blocks) or the small readers here (the
KubeControllersConfiguration's grace period, ClusterInformation's readiness, the IPAMConfig's cooldown,
KubeVirt's VMs and VMIs); a malformed one is replaced by a stand-in that keeps IPs (`_stand_in`, the
rules of each kind in `convert`'s docstring).  Pods and IPAMBlocks have a fast path: typed straight from
their bytes by msgspec (`producer/slim.py`), in list pages (`typed_item`) and watch events (`fast_event`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
import orjson

from kubeio.watch import WatchEvent
from producer import slim, slimpods
from producer.kinds import FAST_KINDS, Kind
from shared import kubevirt as kv
from shared.duration import parse_duration
from shared.errors import BadPodIP, ConfigError, MalformedObject
from shared.ipamconfig import MAX_COOLDOWN_SECONDS, IPAMConfig, parse_ipam_config
from shared.keys import pod_key
from shared.model import LABEL_NODE_NETWORK_DURING_MIGRATION, Node, Pod
from shared.netaddr import AddressError, name_to_cidr, parse_network
from shared.parse import parse_block, parse_node, parse_pod


@dataclass(frozen=True, slots=True)
class ControllersConfig:
    """KubeControllersConfiguration: only `spec.controllers.node.leakGracePeriod` (seconds; None: unset)."""

    name: str
    leak_grace: float | None


@dataclass(frozen=True, slots=True)
class ClusterInfo:
    """ClusterInformation: only `spec.datastoreReady` (None: not set, Calico leaves readiness as it was)."""

    name: str
    datastore_ready: bool | None


@dataclass(frozen=True, slots=True)
class IpamConfigObject:
    """IPAMConfig (v1) / IPAMConfiguration (v3): only `spec.ipCooldownSeconds` (`shared.ipamconfig`)."""

    name: str
    config: IPAMConfig


@dataclass(frozen=True, slots=True)
class Typed:
    """An object as the mirror keys it.  `obj` None: keep the mirrored version (unparsable); `key` None:
    the object cannot even be identified."""

    key: str | None
    obj: object | None
    problem: MalformedObject | None = None


def _identity(raw: object) -> tuple[str, str]:
    meta = raw.get("metadata") if isinstance(raw, Mapping) else None
    if not isinstance(meta, Mapping):
        return "", ""
    ns, name = meta.get("namespace"), meta.get("name")
    return (ns if isinstance(ns, str) else "", name if isinstance(name, str) else "")


def _uid(raw: object) -> str:
    meta = raw.get("metadata") if isinstance(raw, Mapping) else None
    uid = meta.get("uid") if isinstance(meta, Mapping) else None
    return uid if isinstance(uid, str) else ""


def _block_cidr(raw: object, name: str) -> str | None:
    with contextlib.suppress(AddressError):
        return str(name_to_cidr(name))
    spec = raw.get("spec") if isinstance(raw, Mapping) else None
    cidr = spec.get("cidr") if isinstance(spec, Mapping) else None
    with contextlib.suppress(AddressError):
        return str(parse_network(cidr, strict=False)) if isinstance(cidr, str) else None
    return None


def _spec_path(kind: str, name: str, raw: Mapping[str, Any], *path: str) -> object:
    node: object = raw.get("spec")
    for step in path:
        if node is None:
            return None
        if not isinstance(node, Mapping):
            raise MalformedObject(kind, name, f"spec.{'.'.join(path)}: {step} is not inside an object")
        node = node.get(step)
    return node


def parse_controllers_config(raw: Mapping[str, Any], name: str) -> ControllersConfig:
    kind = "KubeControllersConfiguration"
    value = _spec_path(kind, name, raw, "controllers", "node", "leakGracePeriod")
    if value is None:
        return ControllersConfig(name, None)
    if not isinstance(value, str):
        raise MalformedObject(kind, name, f"leakGracePeriod is {value!r}, not a duration")
    try:
        return ControllersConfig(name, parse_duration(value))
    except ConfigError as exc:
        raise MalformedObject(kind, name, str(exc)) from exc


def parse_cluster_info(raw: Mapping[str, Any], name: str) -> ClusterInfo:
    value = _spec_path("ClusterInformation", name, raw, "datastoreReady")
    if value is not None and not isinstance(value, bool):
        raise MalformedObject("ClusterInformation", name, f"datastoreReady is {value!r}")
    return ClusterInfo(name, value)


def convert(kind: Kind, raw: object) -> Typed:
    """Type one raw object; a malformed one becomes what keeps IPs.

    - pod: a stand-in with no node and no IPs (every allocation naming it is "no pod IP yet": valid),
      or, when only an IP does not parse, the pod with its IPs unparsed (Calico decides a pod on another
      node before it parses IPs; otherwise, finished pods too, `pod-ip-unparsable`: valid);
    - node: a stand-in that exists, labelled as being migrated (its empty blocks are never released);
    - block: nothing (the mirrored version, if any, stays);
    - KubeControllersConfiguration: an unset grace period (nothing is collected on live nodes);
    - ClusterInformation: datastore not ready (nothing is decided);
    - VirtualMachine / VirtualMachineInstance: one that exists, not owned by a VM (its IPs are valid).
    - IPAMConfig: the longest cooldown its schema allows (released IPs kept off reuse the longest).
    """
    ns, name = _identity(raw)
    try:
        if kind is Kind.PODS:
            pod = parse_pod(raw)
            return Typed(pod_key(pod.namespace, pod.name), pod)
        if kind is Kind.NODES:
            node = parse_node(raw)
            return Typed(node.name, node)
        if kind is Kind.BLOCKS:
            block = parse_block(raw)
            return Typed(block.cidr_str, block)
        if not isinstance(raw, Mapping) or not name:
            raise MalformedObject(kind.value, name, "no metadata.name")
        if kind is Kind.CONTROLLERS_CONFIG:
            return Typed(name, parse_controllers_config(raw, name))
        if kind is Kind.CLUSTER_INFO:
            return Typed(name, parse_cluster_info(raw, name))
        if kind is Kind.VMS:
            vm = kv.parse_vm(raw)
            return Typed(vm.key, vm)
        if kind is Kind.VMIS:
            vmi = kv.parse_vmi(raw)
            return Typed(vmi.key, vmi)
        if kind is Kind.IPAM_CONFIG:
            config = parse_ipam_config(raw)  # never raises: an unreadable value is the longest cooldown
            problem = None if config.problem is None else MalformedObject("IPAMConfig", name, config.problem)
            return Typed(name, IpamConfigObject(name, config), problem)
    except MalformedObject as exc:
        return _stand_in(kind, raw, ns, name, exc)
    raise ValueError(f"{kind} objects are not typed by the watcher")


def loads_item(raw: bytes | msgspec.Raw) -> Any:
    """A list item's bytes as JSON (orjson reads a Raw through its buffer; an undecodable item is
    `None`, which `convert` names as malformed)."""
    try:
        return orjson.loads(memoryview(raw))
    except orjson.JSONDecodeError:
        return None


_CHANGES = frozenset({"ADDED", "MODIFIED", "DELETED"})


def fast_typed(kind: Kind, raw: bytes | msgspec.Raw) -> tuple[Typed, str] | None:
    """(typed object, resourceVersion) from the bytes of a pod or block, or None: use `convert`."""
    if kind is Kind.BLOCKS:
        b = slim.block(raw)
        return (Typed(b[0].cidr_str, b[0]), b[1]) if b is not None else None
    if kind is Kind.PODS:
        p = slimpods.pod(raw)
        return (Typed(pod_key(p[0].namespace, p[0].name), p[0]), p[1]) if p is not None else None
    return None


def typed_item(kind: Kind, raw: object) -> Typed | None:
    """A list item: bytes through the fast path (else decoded and `convert`ed); a pod typed with its page
    (`slimpods.pod_list_page`) as it is; a dict: None."""
    if isinstance(raw, Pod):
        return Typed(pod_key(raw.namespace, raw.name), raw)
    if not isinstance(raw, (bytes, msgspec.Raw)):
        return None
    fast = fast_typed(kind, raw) if kind in FAST_KINDS else None
    return fast[0] if fast is not None else None


def _stand_in(kind: Kind, raw: object, ns: str, name: str, exc: MalformedObject) -> Typed:
    if kind is Kind.PODS and isinstance(exc, BadPodIP) and isinstance(exc.pod, Pod):
        return Typed(pod_key(exc.pod.namespace, exc.pod.name), exc.pod, exc)  # its IPs unparsed
    if kind is Kind.PODS:
        key = pod_key(ns, name) if ns and name else None
        return Typed(key, Pod(namespace=ns, name=name, uid=_uid(raw)) if key else None, exc)
    if kind is Kind.NODES:
        labels = {LABEL_NODE_NETWORK_DURING_MIGRATION: "unknown"}
        return Typed(name or None, Node(name=name, uid=_uid(raw), labels=labels) if name else None, exc)
    if kind is Kind.BLOCKS:
        return Typed(_block_cidr(raw, name) if name else None, None, exc)
    if kind is Kind.CONTROLLERS_CONFIG:
        return Typed(name or None, ControllersConfig(name, None) if name else None, exc)
    if kind in (Kind.VMS, Kind.VMIS):
        if not (ns and name):
            return Typed(None, None, exc)
        vm = kv.VirtualMachine(ns, name) if kind is Kind.VMS else kv.VirtualMachineInstance(ns, name)
        return Typed(vm.key, vm, exc)
    if kind is Kind.IPAM_CONFIG:
        longest = IPAMConfig(MAX_COOLDOWN_SECONDS, str(exc))
        return Typed(name or None, IpamConfigObject(name, longest) if name else None, exc)
    return Typed(name or None, ClusterInfo(name, False) if name else None, exc)


def fast_event(kind: Kind) -> Callable[[bytes], WatchEvent | None] | None:
    """The watch decoder of `kind` for `kubeio.watch.WatchStream`: a pod or block event typed straight
    from its bytes (`producer/slim.py`: envelope and object in one decode), or None for the other kinds
    (then orjson and `convert`).  The decoder answers None for what it does not type (a bookmark, an
    ERROR, an unexpected shape): the stream then reads that line generically."""
    if kind is Kind.BLOCKS:
        return _block_event
    if kind is Kind.PODS:
        return _pod_event
    return None


def _block_event(line: bytes) -> WatchEvent | None:
    event = slim.block_event(line)
    if event is None or event[0] not in _CHANGES or event[1] is None:
        return None
    b, rv = event[1]
    return WatchEvent(event[0], {}, rv, Typed(b.cidr_str, b))


def _pod_event(line: bytes) -> WatchEvent | None:
    pod_event = slimpods.pod_event(line)
    if pod_event is None or pod_event[0] not in _CHANGES or pod_event[1] is None:
        return None
    p, rv = pod_event[1]
    return WatchEvent(pod_event[0], {}, rv, Typed(pod_key(p.namespace, p.name), p))
