"""The simulated cluster's workload: nodes join and leave, pods live and die, and leaks happen on purpose.

`SimCluster` drives the API store like the kubelet, the scheduler, the node lifecycle controller and
Calico's CNI plugin together, and records ground truth (`lab/cluster/truth.py`) for every IP.  Each kind of
leak Calico's users hit is a named scenario method (`leak_*`, in `lab/cluster/leaks.py`); so are the
look-alikes that must *not* be released (`stale_node_attribute`, `dual_stack_single_status`, there, and
`windows_node`).  Building the cluster it
starts from in bulk (and exporting it) is `lab/cluster/loading.py`.
"""

from __future__ import annotations

import hashlib
import random
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from lab.apiserver.store import SimApiError, Store
from lab.cluster import loading
from lab.cluster.cni import CalicoCNI
from lab.cluster.ipam import WINDOWS_NOTE, WINDOWS_RESERVED_HANDLE
from lab.cluster.leaks import LeakScenarios, atomic
from lab.cluster.loading import TUNNEL_HANDLE, node_name, pod_name
from lab.cluster.objects import node_object, node_ready, pod_object
from lab.cluster.podshape import CREATOR, KUBELET, PodSize, dressed_status
from lab.cluster.podshape import pod_size as pod_size_of
from lab.cluster.truth import GroundTruth
from shared import blockops
from shared.blockops import ip_of
from shared.calicogroup import V1
from shared.netaddr import cidr_to_name

# `node_name` and `pod_name` are the cluster's naming, imported from here by its users (churn, demo).
__all__ = ["DEFAULT_POOLS", "SimCluster", "node_name", "pod_name"]

DEFAULT_POOLS = [("10.64.0.0/10", 26), ("fd00:10::/104", 122)]
Sandbox = tuple[str, list[str]]  # a pod's CNI handle and IPs


class SimCluster(LeakScenarios):
    """A workload driver with ground truth, writing through the same store the API server serves."""

    def __init__(
        self,
        store: Store,
        seed: int = 0,
        pools: list[tuple[str, int]] | None = None,
        clock: Callable[[], float] = time.time,
        tunnel_type: str | None = "vxlanTunnelAddress",
        pod_size: PodSize = "small",
    ) -> None:
        """`pod_size` (`lab.cluster.podshape`): the size of the pods the cluster's actors make (the bulk
        load, `create_pod`, the churn's, KubeVirt's launcher pods): ``small`` (the default: the
        simulator's minimal pods), ``real`` (~10–15 KB of JSON) or ``large`` (~50 KB)."""
        self.store = store
        self.seed = seed
        self.pod_size = pod_size_of(pod_size)
        self.rng = random.Random(seed)
        self.clock = clock
        self.truth = GroundTruth()
        self.tunnel_type = tunnel_type
        self._seq = 0
        self._lock = threading.RLock()
        self.calico = store.calico or V1  # the group the store serves Calico's objects in
        self.cni = CalicoCNI(store, pools or DEFAULT_POOLS, self._clock_ns, SimApiError, self.calico)
        self.pod_handles: dict[tuple[str, str], tuple[str, list[str]]] = {}  # pod → (handle, ips)
        # The last serial a churn driver (`lab.cluster.churn.Churn`) named a pod with: a later driver on the
        # same cluster (the benchmark runs one per rate) goes on from it, never reusing a name.
        self.churn_serial = 0
        self.pod_nodes: dict[tuple[str, str], str] = {}
        self.node_names: set[str] = set()
        self.generation: dict[tuple[str, str], int] = {}
        self._pod_list: list[tuple[str, str]] = []
        self._pod_index: dict[tuple[str, str], int] = {}
        store.add_hook(self._on_commit)

    def _clock_ns(self) -> int:
        self._seq += 1
        return int(self.clock() * 1e9) + self._seq

    # -- observing writes -----------------------------------------------------------------------------

    def _on_commit(
        self, plural: str, event: str, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None
    ) -> None:
        """Judge every ordinal freed on an IPAMBlock write; a deleted block is the CNI's to claim again."""
        if plural == "ipamblocks" and old is not None:
            self.truth.observe_block_write(event, old, new, self.clock())
            if event == "DELETED":
                self.cni.block_deleted(str(old["spec"]["cidr"]))

    # -- nodes ----------------------------------------------------------------------------------------

    def add_node(self, name: str, labels: Mapping[str, str] | None = None, dual_stack: bool = False) -> None:
        self.store.create("nodes", None, node_object(name, labels))
        self.node_names.add(name)
        if self.tunnel_type is not None:
            self._tunnel(name, self.tunnel_type)
        if dual_stack:
            self._tunnel(name, "vxlanV6TunnelAddress")

    def _tunnel(self, node: str, kind: str) -> str:
        handle = f"{TUNNEL_HANDLE[kind]}-{node}"
        at = self.clock()
        version = 6 if "V6" in kind else 4
        ip = self.cni.assign(node, handle, {"node": node, "type": kind}, version=version)
        self.truth.allocated(ip, handle, f"tunnel:{node}", at)
        return ip

    def windows_node(self, name: str) -> None:
        """A Windows node: its block has the first three and the last ordinal reserved (before any use),
        as Calico's `newBlock` reserves them: no sequence numbers, no IPAMHandle."""
        self.store.create("nodes", None, node_object(name, {"kubernetes.io/os": "windows"}))
        self.node_names.add(name)
        cidr = self.cni.claim_block(name, 4)
        block = self.store.get("ipamblocks", None, cidr_to_name(cidr))
        spec = block["spec"]
        size = len(spec["allocations"])
        wanted = blockops.reserve_in_place(spec, WINDOWS_RESERVED_HANDLE, WINDOWS_NOTE, [0, 1, 2, size - 1])
        for o in wanted:
            self.truth.allocated(ip_of(spec, o), WINDOWS_RESERVED_HANDLE, f"reserved:{name}", self.clock())
        self.store.replace("ipamblocks", None, block["metadata"]["name"], block)
        if self.tunnel_type is not None:
            self._tunnel(name, self.tunnel_type)

    @atomic
    def delete_node(self, name: str) -> None:
        """A node that dies: its Node object goes, its pods and IPAM data stay (nobody ran CNI DEL)."""
        at = self.clock()
        self.store.delete("nodes", None, name)
        self.node_names.discard(name)
        for ip, lives in list(self.truth.usages.items()):
            life = lives[-1]
            # Its tunnel IPs, its pods' IPs and its Windows-reserved ordinals (they go with its blocks).
            mine = life.owner in (f"tunnel:{name}", f"reserved:{name}") or self._on_node(life.owner, name)
            if life.freed_at is None and mine:
                self.truth.stop_using(ip, at)

    def set_node_ready(self, name: str, ready: bool) -> None:
        """The node's Ready condition, as the node lifecycle controller writes it: NotReady ("Unknown") when
        its kubelet stops reporting (a partition, a machine gone), Ready when it is back.  Nothing else
        changes: its pods run on, or may, and their IPs stay in use."""
        node = self.store.get("nodes", None, name)
        status = {"type": "Ready", "status": "True" if ready else "Unknown"}
        node["status"] = {**(node.get("status") or {}), "conditions": [status]}
        self.store.replace("nodes", None, name, node, subresource="status")

    def _on_node(self, owner: str, node: str) -> bool:
        if "/" not in owner:
            return False
        ns, pod = owner.split("/", 1)
        return self.pod_nodes.get((ns, pod)) == node

    @atomic
    def remove_pods_of_node(self, node: str) -> list[tuple[str, str]]:
        """The node lifecycle controller's pod GC, later: pod objects removed, no CNI DEL (their IPs are
        leaks from now, also those of a pod that started there after the node went)."""
        gone = [k for k, n in self.pod_nodes.items() if n == node]
        at = self.clock()
        for ns, pod in gone:
            for ip in self.pod_handles.get((ns, pod), ("", []))[1]:
                self.truth.stop_using(ip, at)
            self._delete_pod_object(ns, pod)
        return gone

    @atomic
    def leak_node_deleted(self, name: str, remove_pods: bool = True) -> None:
        """Scenario: node deleted with its pods on it (pods removed after, as the lifecycle controller)."""
        self.delete_node(name)
        if remove_pods:
            self.remove_pods_of_node(name)

    # -- pods -----------------------------------------------------------------------------------------

    def _container_id(self, ns: str, pod: str) -> str:
        gen = self.generation.get((ns, pod), 0)
        self.generation[(ns, pod)] = gen + 1
        return hashlib.sha256(f"{ns}/{pod}/{gen}/{self.rng.random()}".encode()).hexdigest()

    def cni_add(
        self,
        ns: str,
        pod: str,
        node: str,
        dual_stack: bool = False,
        attr_node: str | None = None,
        container_id: str | None = None,
    ) -> tuple[str, list[str]]:
        """CNI ADD of the pod's sandbox `container_id` (a new one if None): its handle and IPs."""
        handle = f"k8s-pod-network.{container_id or self._container_id(ns, pod)}"
        attrs = {
            "namespace": ns,
            "node": attr_node or node,
            "pod": pod,
            "timestamp": time.strftime("%Y-%m-%d %H:%M:%S.000000000 +0000 UTC", time.gmtime(self.clock())),
        }
        at = self.clock()
        ips = [self.cni.assign(attr_node or node, handle, attrs, version=4)]
        if dual_stack:
            ips.append(self.cni.assign(attr_node or node, handle, attrs, version=6))
        for ip in ips:
            self.truth.allocated(ip, handle, f"{ns}/{pod}", at)
        return handle, ips

    @atomic
    def create_pod(
        self,
        ns: str,
        pod: str,
        node: str,
        dual_stack: bool = False,
        attr_node: str | None = None,
        report: str = "all",
    ) -> list[str]:
        """Created → scheduled → CNI ADD → status.podIP(s) → Running.  `report`: all, v4, none."""
        self.store.ensure_namespace(ns)
        sandbox = self._container_id(ns, pod)  # the kubelet's sandbox, as Calico's CNI annotates it
        obj = pod_object(
            ns, pod, node, [], phase="Pending", size=self.pod_size, seed=self.seed, container_id=sandbox
        )
        self.store.create("pods", ns, obj, field_manager=CREATOR)
        self._track_pod((ns, pod), node)
        handle, ips = self.cni_add(ns, pod, node, dual_stack, attr_node, container_id=sandbox)
        self.pod_handles[(ns, pod)] = (handle, ips)
        reported = {"all": ips, "v4": ips[:1], "none": []}[report]
        self._set_status(ns, pod, reported, "Running" if reported else "Pending")
        return ips

    def _set_status(self, ns: str, pod: str, ips: list[str], phase: str) -> None:
        status: dict[str, Any] = {"phase": phase}
        if ips:
            status["podIP"] = ips[0]
            status["podIPs"] = [{"ip": ip} for ip in ips]
        obj = self.store.get("pods", ns, pod)
        obj["status"] = dressed_status(obj, status, self.pod_size, self.seed)
        self.store.replace("pods", ns, pod, obj, subresource="status", field_manager=KUBELET)

    @atomic
    def delete_pod(self, ns: str, pod: str) -> None:
        """A clean deletion, in a real cluster's order: the DELETE marks the pod terminating (its grace
        period), the kubelet stops it and CNI DEL releases the IPs, then the kubelet confirms (grace 0)
        and the object goes."""
        try:
            self.store.delete("pods", ns, pod)
        except SimApiError as exc:
            if exc.code != 404:
                raise
        self._cni_del(ns, pod)
        self._delete_pod_object(ns, pod)

    @atomic
    def confirm_deletion(self, ns: str, pod: str, uid: str, sandbox: Sandbox | None = None) -> str:
        """A kubelet's part of a graceful deletion (`lab.cluster.kubelet`): if pod `uid` (`sandbox`: its
        handle and IPs, if the cluster did not start it) is still being deleted and its node is Ready, CNI DEL
        then the grace-0 DELETE, as `delete_pod`.  "confirmed"; "gone" (no such pod being deleted);
        "node-not-ready" (no kubelet answers: nothing done)."""
        obj = self._get("pods", ns, pod)
        if obj is None or obj["metadata"].get("uid") != uid or not obj["metadata"].get("deletionTimestamp"):
            return "gone"
        node = self._get("nodes", None, str((obj.get("spec") or {}).get("nodeName") or ""))
        if node is None or not node_ready(node):
            return "node-not-ready"
        self._cni_del(ns, pod, sandbox)
        self._delete_pod_object(ns, pod)
        return "confirmed"

    def _get(self, plural: str, ns: str | None, name: str) -> dict[str, Any] | None:
        try:
            return self.store.get(plural, ns, name, copy=False)
        except SimApiError as exc:
            if exc.code != 404:
                raise
            return None

    def _cni_del(self, ns: str, pod: str, sandbox: Sandbox | None = None) -> None:
        """CNI DEL of the pod's IPs (none when the CNI never ran for it), judged as the CNI's own frees."""
        handle, ips = self.pod_handles.get((ns, pod)) or sandbox or ("", [])
        if ips:
            self.truth.cni_freeing(ips, True)
            try:
                self.cni.release_ips(handle, ips)
            finally:
                self.truth.cni_freeing(ips, False)

    def _delete_pod_object(self, ns: str, pod: str) -> None:
        try:
            self.store.delete("pods", ns, pod, grace_period_seconds=0)  # the kubelet's confirmation
        except SimApiError as exc:
            if exc.code != 404:
                raise
        self._untrack_pod((ns, pod))

    # -- bulk (`lab/cluster/loading.py`) ------------------------------------------------------------------

    def bootstrap(self, leak_grace_period: str | None = "15m0s", datastore_ready: bool = True) -> None:
        """The cluster-scoped Calico objects every cluster has: ClusterInformation, KubeControllers-
        Configuration `default` (with `leakGracePeriod` unless None), IPPools, IPAMConfig."""
        loading.bootstrap(self.store, self.cni.pools, leak_grace_period, datastore_ready)

    def set_ip_cooldown(self, seconds: int) -> None:
        """Set `IPAMConfig/default`'s `ipCooldownSeconds` (Calico 3.33), as an operator would."""
        loading.set_ip_cooldown(self.store, seconds)

    def populate(
        self, nodes: int, pods_per_node: int, namespaces: int = 10, dual_stack_every: int = 0
    ) -> None:
        """Build a cluster through the CNI, one API write at a time (realistic, slow at scale)."""
        for n in range(nodes):
            self.add_node(node_name(n))
        for n in range(nodes):
            for p in range(pods_per_node):
                i = n * pods_per_node + p
                ds = bool(dual_stack_every) and i % dual_stack_every == 0
                self.create_pod(f"ns-{i % namespaces}", pod_name(i), node_name(n), dual_stack=ds)

    def bulk_populate(
        self, nodes: int, pods_per_node: int, namespaces: int = 10, dual_stack_every: int = 0
    ) -> None:
        """Build the same cluster as `populate`, computed in memory and loaded in one sweep.

        The objects are those Calico would have written (the in-memory `CalicoIPAM` follows the same
        library rules); this is how 150,000 pods load in seconds.
        """
        loading.bulk_populate(self, nodes, pods_per_node, namespaces, dual_stack_every)

    def export(self) -> dict[str, Any]:
        """The `kubectl get nodes,pods,ipamblocks,ipamhandles,blockaffinities -A -o json` List (and the
        KubeVirt VMs and VMIs, when the cluster serves kubevirt.io)."""
        return loading.export(self.store)

    # -- the pod index (what the churn picks from) ----------------------------------------------------

    def random_pod(self) -> tuple[str, str] | None:
        with self._lock:
            return self.rng.choice(self._pod_list) if self._pod_list else None

    def _track_pod(self, key: tuple[str, str], node: str) -> None:
        with self._lock:
            if key not in self.pod_nodes:
                self._pod_index[key] = len(self._pod_list)
                self._pod_list.append(key)
            self.pod_nodes[key] = node

    def _untrack_pod(self, key: tuple[str, str]) -> None:
        with self._lock:
            self.pod_nodes.pop(key, None)
            self.pod_handles.pop(key, None)
            index = self._pod_index.pop(key, None)
            if index is not None:
                last = self._pod_list.pop()
                if index < len(self._pod_list):
                    self._pod_list[index] = last
                    self._pod_index[last] = index

    def pod_count(self) -> int:
        return len(self._pod_list)
