"""Simulated kubelets: each Ready node's kubelet confirms a graceful pod deletion once the pod has stopped.

Why: a real API server keeps a bound pod that was DELETEd gracefully, with its ``deletionTimestamp``, until
the kubelet of its node has stopped its containers, run the CNI DEL and confirmed with a grace-0 DELETE
(which removes it: MODIFIED then DELETED).  The simulated server has the same pod strategy, so without a
kubelet a pod deleted with ``kubectl delete pod`` would stay Terminating for ever.  `Kubelets` plays every
node's kubelet in the simulator's own process: a commit hook on the store notes each pod that gets a
``deletionTimestamp``, and when it is due (``delay`` after the DELETE, never later than its grace period)
`SimCluster.confirm_deletion` does the kubelet's part: CNI DEL through the simulated Calico CNI (a clean
release in the ground truth), then the grace-0 DELETE.

A pod whose node is lost (its Node deleted) or NotReady is not confirmed: no kubelet answers for it.  It
stays Terminating until the pod GC (`SimCluster.remove_pods_of_node`) removes it without CNI DEL, and its
IPs become leaks then, as on a real cluster.  A NotReady node that turns Ready again (a kubelet back from
a partition) confirms its pods at once.

The cluster's own clean deletions (`SimCluster.delete_pod`, the churn's) confirm themselves in the same
call; the kubelet finds them gone and does nothing.  Idle, it costs nothing: its thread waits for the next
due time or a new deletion, never polls.  Tests call `step(now)` with a fake clock instead of `start()`.
"""

from __future__ import annotations

import heapq
import ipaddress
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from lab.apiserver.store import SimApiError
from lab.cluster.cluster import SimCluster
from lab.cluster.objects import node_ready

__all__ = ["DEFAULT_DELAY", "Kubelets"]

log = logging.getLogger(__name__)

#: Seconds from a pod's DELETE to its kubelet's confirmation: the containers of a pod that handles SIGTERM
#: stop within about a second, and a kubelet reports the pod's end within its next sync (~1 s).
DEFAULT_DELAY = 1.0

PodKey = tuple[str, str]  # namespace, name


class _Deletion(NamedTuple):
    due: float
    uid: str
    node: str


class Kubelets:
    """Every node's kubelet, for the graceful deletions of `cluster`'s pods (see the module docstring)."""

    def __init__(
        self, cluster: SimCluster, delay: float = DEFAULT_DELAY, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if delay < 0:
            raise ValueError("the kubelet delay must be 0 or more seconds")
        self.cluster = cluster
        self.delay = delay
        self.clock = clock
        self.confirmed = 0  # deletions confirmed (CNI DEL, then the grace-0 DELETE)
        self.errors = 0  # confirmations that failed (logged; the pod stays Terminating)
        self._pending: dict[PodKey, _Deletion] = {}
        self._heap: list[tuple[float, PodKey]] = []  # (due, pod); an entry not in `_pending` is stale
        self._parked: dict[str, dict[PodKey, _Deletion]] = {}  # node → deletions waiting for it to be Ready
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        cluster.store.add_hook(self._on_commit)
        for pod in cluster.store.list("pods", copy=False)["items"]:
            self._note(pod, None)  # pods already Terminating (a loaded snapshot): their kubelets go on

    # -- what the kubelets learn from the API server ------------------------------------------------------

    def _on_commit(
        self, plural: str, event: str, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None
    ) -> None:
        """Called under the store's lock: only notes what to do, never writes."""
        obj = new if new is not None else old
        if obj is None:
            return
        if plural == "pods":
            if event == "DELETED":
                self._forget((str(obj["metadata"].get("namespace")), str(obj["metadata"]["name"])))
            else:
                self._note(obj, old)
        elif plural == "nodes":
            name = str(obj["metadata"]["name"])
            if event == "DELETED":
                with self._cond:
                    self._parked.pop(name, None)  # lost: its pods wait for the pod GC
            elif node_ready(obj):
                self._unpark(name)

    def _note(self, pod: Mapping[str, Any], old: Mapping[str, Any] | None) -> None:
        meta = pod["metadata"]
        at = meta.get("deletionTimestamp")
        grace = meta.get("deletionGracePeriodSeconds")
        if not at or not grace or (old is not None and old["metadata"].get("deletionTimestamp") == at):
            return  # not being deleted, at grace 0 (DELETED follows), or no new deletion
        key = (str(meta.get("namespace")), str(meta["name"]))
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        deletion = _Deletion(self.clock() + min(self.delay, float(grace)), str(meta.get("uid")), node)
        with self._cond:
            known = self._pending.get(key)
            if known is not None and known.uid == deletion.uid and known.due <= deletion.due:
                return  # a shorter grace period asked again: the kubelet is already on it
            self._parked.get(node, {}).pop(key, None)
            self._schedule(key, deletion)

    def _schedule(self, key: PodKey, deletion: _Deletion) -> None:  # self._cond held
        self._pending[key] = deletion
        heapq.heappush(self._heap, (deletion.due, key))
        if self._heap[0][1] == key:
            self._cond.notify_all()  # a new earliest due time

    def _forget(self, key: PodKey) -> None:
        with self._cond:
            deletion = self._pending.pop(key, None)
            if deletion is None:
                for parked in self._parked.values():
                    parked.pop(key, None)

    def _unpark(self, node: str) -> None:
        with self._cond:
            now = self.clock()
            for key, deletion in self._parked.pop(node, {}).items():
                self._schedule(key, deletion._replace(due=now))

    # -- what they do --------------------------------------------------------------------------------------

    def step(self, now: float | None = None) -> int:
        """Confirm every deletion due by `now` (default: the clock's now); how many were confirmed."""
        now = self.clock() if now is None else now
        due: list[tuple[PodKey, _Deletion]] = []
        with self._cond:
            while self._heap and self._heap[0][0] <= now:
                at, key = heapq.heappop(self._heap)
                deletion = self._pending.get(key)
                if deletion is not None and deletion.due == at:
                    del self._pending[key]
                    due.append((key, deletion))
        confirmed = 0
        for (ns, name), deletion in due:
            try:
                sandbox = None if (ns, name) in self.cluster.pod_handles else self._sandbox(ns, name)
                outcome = self.cluster.confirm_deletion(ns, name, deletion.uid, sandbox)
            except SimApiError as exc:
                self.errors += 1
                log.warning("kubelet: %s/%s not confirmed: %s", ns, name, exc, extra={"node": deletion.node})
                continue
            if outcome == "confirmed":
                confirmed += 1
            elif outcome == "node-not-ready":
                self._park((ns, name), deletion)
        self.confirmed += confirmed
        return confirmed

    def _sandbox(self, ns: str, name: str) -> tuple[str, list[str]] | None:
        """A pod the cluster did not start (a loaded snapshot's): the handle and IPs its CNI DEL releases, as
        Calico's plugin finds them, by the handle of the allocations holding its reported IPs (those whose
        attributes name this pod: a snapshot's leaks may report IPs another pod holds)."""
        try:
            pod = self.cluster.store.get("pods", ns, name, copy=False)
        except SimApiError:
            return None
        reported = {
            str(p.get("ip")) for p in (pod.get("status") or {}).get("podIPs") or [] if isinstance(p, dict)
        }
        if not reported:
            return None
        handle, ips = "", list[str]()
        for block in self.cluster.store.list("ipamblocks", copy=False)["items"]:
            spec = block["spec"]
            net = ipaddress.ip_network(str(spec["cidr"]))
            for ip in [i for i in reported if ipaddress.ip_address(i) in net]:
                index = spec["allocations"][int(ipaddress.ip_address(ip)) - int(net.network_address)]
                attrs = spec["attributes"][index] if isinstance(index, int) else {}
                secondary = attrs.get("secondary") or {}
                if (
                    secondary.get("namespace") == ns
                    and secondary.get("pod") == name
                    and attrs.get("handle_id")
                ):
                    handle, ips = str(attrs["handle_id"]), [*ips, ip]
        return (handle, ips) if ips else None

    def _park(self, key: PodKey, deletion: _Deletion) -> None:
        """Wait for the node to be Ready; if it turned Ready after `confirm_deletion` looked, go on now."""
        with self._cond:
            if key in self._pending:
                return  # deleted again meanwhile: scheduled anew
            self._parked.setdefault(deletion.node, {})[key] = deletion
        try:
            node = self.cluster.store.get("nodes", None, deletion.node, copy=False)
        except SimApiError:
            with self._cond:  # lost: nothing waits for it (the pod GC's turn)
                waiting = self._parked.get(deletion.node, {})
                waiting.pop(key, None)
                if not waiting:
                    self._parked.pop(deletion.node, None)
            return
        if node_ready(node):
            self._unpark(deletion.node)

    def next_due(self) -> float | None:
        """When the next deletion is due (the clock's time), None when none is pending."""
        with self._cond:
            return self._next_due_locked()

    def _next_due_locked(self) -> float | None:
        while self._heap:
            at, key = self._heap[0]
            deletion = self._pending.get(key)
            if deletion is not None and deletion.due == at:
                return at
            heapq.heappop(self._heap)  # stale: confirmed, forgotten or rescheduled
        return None

    def pending(self) -> int:
        """Deletions waiting: due later, or parked on a node that is not Ready."""
        with self._cond:
            return len(self._pending) + sum(len(p) for p in self._parked.values())

    # -- the thread ----------------------------------------------------------------------------------------

    def start(self) -> Kubelets:
        """Run the kubelets in a thread of this process (`close` stops it); the clock must be a real one."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="sim-kubelets", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._closed:
                    return
                at = self._next_due_locked()
                wait = None if at is None else at - self.clock()
                if wait is None or wait > 0:
                    self._cond.wait(wait)  # woken by a new earliest deletion, a node back, or close()
                    continue
            self.step()

    def close(self) -> None:
        """Stop the thread and stop listening to the store; deletions not yet confirmed stay Terminating."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
        self.cluster.store.remove_hook(self._on_commit)

    def __enter__(self) -> Kubelets:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
