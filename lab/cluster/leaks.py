"""The simulated cluster's leak scenarios (`SimCluster` inherits them): each kind of leak Calico's users
hit made on purpose, and the look-alikes that must *not* be released, with their ground truth.

Why a module: `lab/cluster/cluster.py` owns the cluster's nodes, pods and CNI calls; these are the
scenarios built on them, kept apart so that adding one does not grow the cluster.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar, cast

from lab.apiserver.store import Store
from lab.cluster.cni import CalicoCNI
from lab.cluster.podshape import KUBELET, PodSize, dressed_status
from lab.cluster.truth import GroundTruth

_Method = TypeVar("_Method", bound=Callable[..., Any])


def atomic(method: _Method) -> _Method:
    """A cluster change and its ground truth in one step: the churn and the scenarios run in different
    threads, and a pod created on a node while the node is lost must not fall between the node's
    bookkeeping and the pod's (the truth would call its IP in use after its pod object is gone)."""

    @functools.wraps(method)
    def locked(self: Any, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return cast(_Method, locked)


class LeakScenarios:
    """The scenarios, on what `SimCluster` has (declared here for the type checker)."""

    store: Store
    truth: GroundTruth
    cni: CalicoCNI
    clock: Callable[[], float]
    seed: int
    pod_size: PodSize
    pod_handles: dict[tuple[str, str], tuple[str, list[str]]]
    pod_nodes: dict[tuple[str, str], str]
    _lock: threading.RLock
    cni_add: Callable[..., tuple[str, list[str]]]
    create_pod: Callable[..., list[str]]
    _set_status: Callable[[str, str, list[str], str], None]
    _delete_pod_object: Callable[[str, str], None]

    @atomic
    def leak_pod_deleted_without_cni_del(self, ns: str, pod: str) -> list[str]:
        _, ips = self.pod_handles.get((ns, pod), ("", []))
        at = self.clock()
        for ip in ips:
            self.truth.stop_using(ip, at)
        self._delete_pod_object(ns, pod)
        return ips

    @atomic
    def leak_ip_changed(self, ns: str, pod: str) -> list[str]:
        """The pod's sandbox was recreated without CNI DEL: a new IP, the old one leaks."""
        node = self.pod_nodes[(ns, pod)]
        _, old = self.pod_handles[(ns, pod)]
        handle, ips = self.cni_add(ns, pod, node, dual_stack=len(old) > 1)
        self.pod_handles[(ns, pod)] = (handle, ips)
        self._set_status(ns, pod, ips, "Running")
        at = self.clock()
        for ip in old:
            self.truth.stop_using(ip, at)
        return old

    @atomic
    def leak_terminal_pod(self, ns: str, pod: str, phase: str = "Succeeded") -> list[str]:
        """A finished pod keeps its object (and status IPs) but its sandbox, and IP use, are gone."""
        _, ips = self.pod_handles[(ns, pod)]
        at = self.clock()
        obj = self.store.get("pods", ns, pod)
        obj["status"]["phase"] = phase
        if self.pod_size != "small":  # its containers terminated too, as its kubelet reports
            kept = {k: v for k, v in obj["status"].items() if k in ("phase", "reason", "podIP", "podIPs")}
            obj["status"] = dressed_status(obj, kept, self.pod_size, self.seed)
        self.store.replace("pods", ns, pod, obj, subresource="status", field_manager=KUBELET)
        for ip in ips:
            self.truth.stop_using(ip, at)
        return ips

    def stale_node_attribute(self, ns: str, pod: str, node: str, attr_node: str) -> list[str]:
        """Not a leak (#12257): the CNI wrote `attr_node` but the pod runs on `node` and uses the IP."""
        return self.create_pod(ns, pod, node, attr_node=attr_node)

    def dual_stack_single_status(self, ns: str, pod: str, node: str) -> list[str]:
        """Not a leak (#5044): a dual-stack pod whose status lists only its IPv4."""
        return self.create_pod(ns, pod, node, dual_stack=True, report="v4")

    def empty_block(self, node: str, version: int = 4) -> str:
        """An extra, empty affine block on a live node (released after the grace period)."""
        return self.cni.claim_block(node, version)
