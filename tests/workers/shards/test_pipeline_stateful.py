"""The decision pipeline (the watcher's `Mirror` + the workers' `validate_shard`, on real Redis and a fake
clock) against a small reference model, with Hypothesis choosing the story.

The model is the cluster's truth: nodes, pods, and every allocation with whether something still uses it
(a pod that exists, is not finished and owns it; a tunnel IP of a live node) and since when it is leaked.
Rules change the cluster (create a pod with or without its IP reported, report it later, delete a pod with
or without CNI DEL, change a pod's IP, finish a pod, delete a node with its pods) and deliver the events to
the mirror the way watches do and do not: any pending object in any order (level-triggered, the latest
state), twice, or never (dropped) until a full resync relists everything.  Other rules run the shard jobs
and move the clock.

Invariants, on every decision the workers emit:
- never for an allocation the model says is in use;
- on a live node only once the allocation has been leaked for longer than the grace period; on a gone
  node at once (and the model agrees the node is gone);
and after a full resync followed by a validation, every leak the model knows is a candidate or decided.

The one assumption: an event is never withheld for a whole grace period while the clock runs (a watch
that broke is re-established or relisted within seconds; beyond that, the leader's live re-check is what
refuses a decision made on a stale mirror, tests/workers/leader).  So the clock moves only while every
withheld object has been withheld for less than the grace period.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule, run_state_machine_as_test

from lab.cluster.ipam import CalicoIPAM
from lab.cluster.objects import node_object, pod_object
from producer.mirror import Mirror
from producer.relist import Kind
from shared.clock import FakeClock
from shared.gcrecords import decode_decision
from shared.keys import Keys
from shared.parse import parse_block, parse_node, parse_pod
from workers.shards.validate import validate_shard

SHARDS = 2
GRACE = 10.0
NS = "default"
NODES = ("node-a", "node-b", "node-c")
KEYS = Keys("stateful")


@dataclass
class Alloc:
    alloc_id: str
    ip: str
    node: str
    pod: str | None  # None: a tunnel IP
    in_use: bool = True
    leaked_at: float | None = None


class Pipeline(RuleBasedStateMachine):
    def __init__(self, redis_client: redis.Redis) -> None:
        super().__init__()
        self.redis = redis_client
        self.redis.flushall()
        self.clock = FakeClock()
        self.mirror = Mirror(redis_client, KEYS, shards=SHARDS, clock=self.clock)
        self.ipam = CalicoIPAM.with_pools(v6=None)
        self.nodes: dict[str, dict[str, Any]] = {}
        self.deleted_nodes: set[str] = set()  # deleted in the model (the mirror may not know yet)
        self.pods: dict[str, dict[str, Any]] = {}
        self.pod_alloc: dict[str, str] = {}  # pod → the alloc id it owns now
        self.allocs: dict[str, Alloc] = {}
        self.pending: dict[tuple[str, str], float] = {}  # object → since when its state is undelivered
        self.dropped: dict[tuple[str, str], float] = {}  # withheld until the next full resync
        self.delivered: set[tuple[str, str]] = set()
        self.decided: set[str] = set()
        self.last_id = "0-0"
        self.serial = 0
        self.rv = 1
        for node in NODES:
            self.nodes[node] = node_object(node)
            handle = f"vxlan-tunnel-addr-{node}"
            ip = self.ipam.assign(node, handle, {"node": node, "type": "vxlanTunnelAddress"})
            self.allocs[f"{handle}/{ip}"] = Alloc(f"{handle}/{ip}", ip, node, None)
        self.mirror.set_config(GRACE, True)
        self._relist()
        self.mirror.mark_synced()

    # -- the cluster ---------------------------------------------------------------------------------

    def _touch(self, kind: str, key: str) -> None:
        if kind == "blocks":
            self.rv += 1
            if key in self.ipam.blocks:
                self.ipam.blocks[key]["metadata"]["resourceVersion"] = str(self.rv)
        obj = (kind, key)
        self.delivered.discard(obj)
        if obj not in self.dropped:
            self.pending.setdefault(obj, self.clock.now())

    def _leak(self, alloc_id: str) -> None:
        a = self.allocs[alloc_id]
        if a.in_use:
            a.in_use, a.leaked_at = False, self.clock.now()

    def _assign(self, pod: str, node: str) -> str:
        self.serial += 1
        handle = f"k8s-pod-network.{self.serial:064x}"
        attrs = {"namespace": NS, "node": node, "pod": pod}
        ip = self.ipam.assign(node, handle, attrs)
        alloc_id = f"{handle}/{ip}"
        self.allocs[alloc_id] = Alloc(alloc_id, ip, node, pod)
        self.pod_alloc[pod] = alloc_id
        self._touch("blocks", self.ipam.block_of(ip))
        return ip

    def _live_pods(self, reported: bool | None = None) -> list[str]:
        out = []
        for name, obj in sorted(self.pods.items()):
            has_ip = bool(obj["status"].get("podIP"))
            if obj["status"]["phase"] in ("Succeeded", "Failed"):
                continue
            if reported is None or reported == has_ip:
                out.append(name)
        return out

    @precondition(lambda self: len(self.nodes) > 0)
    @rule(data=st.data(), report=st.booleans())
    def create_pod(self, data: st.DataObject, report: bool) -> None:
        node = data.draw(st.sampled_from(sorted(self.nodes)))
        self.serial += 1
        name = f"pod-{self.serial}"
        ip = self._assign(name, node)
        self.pods[name] = pod_object(
            NS, name, node, [ip] if report else [], "Running" if report else "Pending"
        )
        self._touch("pods", name)

    @precondition(lambda self: self._live_pods(reported=False))
    @rule(data=st.data())
    def report_ip(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(self._live_pods(reported=False)))
        ip = self.allocs[self.pod_alloc[name]].ip
        self.pods[name]["status"] = {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}
        self._touch("pods", name)

    @precondition(lambda self: self.pods)
    @rule(data=st.data(), cni_del=st.booleans())
    def delete_pod(self, data: st.DataObject, cni_del: bool) -> None:
        name = data.draw(st.sampled_from(sorted(self.pods)))
        del self.pods[name]
        self._touch("pods", name)
        alloc_id = self.pod_alloc.pop(name)
        if cni_del:  # the kubelet ran CNI DEL: the pod's IP is released
            ip = self.allocs.pop(alloc_id).ip
            cidr = self.ipam.block_of(ip)
            self.ipam.release(ip, alloc_id.rsplit("/", 1)[0])
            self._touch("blocks", cidr)
        else:
            self._leak(alloc_id)

    @precondition(lambda self: self._live_pods(reported=True))
    @rule(data=st.data())
    def change_ip(self, data: st.DataObject) -> None:
        """The sandbox was recreated without CNI DEL: a new IP, the old one leaks."""
        name = data.draw(st.sampled_from(self._live_pods(reported=True)))
        old = self.pod_alloc[name]
        ip = self._assign(name, self.pods[name]["spec"]["nodeName"])
        self._leak(old)
        self.pods[name]["status"] = {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}
        self._touch("pods", name)

    @precondition(lambda self: self._live_pods(reported=True))
    @rule(data=st.data())
    def finish_pod(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(self._live_pods(reported=True)))
        self.pods[name]["status"]["phase"] = "Succeeded"
        self._leak(self.pod_alloc[name])
        self._touch("pods", name)

    @precondition(lambda self: len(self.nodes) > 1)
    @rule(data=st.data())
    def delete_node(self, data: st.DataObject) -> None:
        """A node dies with its pods (their objects go too, as the node lifecycle controller does)."""
        node = data.draw(st.sampled_from(sorted(self.nodes)))
        del self.nodes[node]
        self.deleted_nodes.add(node)
        self._touch("nodes", node)
        for name, obj in sorted(self.pods.items()):
            if obj["spec"]["nodeName"] == node:
                del self.pods[name]
                self._touch("pods", name)
                self.pod_alloc.pop(name)
        for alloc_id, a in self.allocs.items():
            if a.node == node:
                self._leak(alloc_id)

    # -- delivery: any order, twice, or not until a resync ---------------------------------------------

    def _deliver(self, obj: tuple[str, str]) -> None:
        kind, key = obj
        if kind == "nodes":
            if key in self.nodes:
                self.mirror.apply_nodes([parse_node(self.nodes[key])])
            else:
                self.mirror.delete_nodes([key])
        elif kind == "pods":
            if key in self.pods:
                self.mirror.apply_pods([parse_pod(copy.deepcopy(self.pods[key]))])
            else:
                self.mirror.delete_pods([(NS, key)])
        elif key in self.ipam.blocks:
            self.mirror.apply_blocks([parse_block(copy.deepcopy(self.ipam.blocks[key]))])
        else:
            self.mirror.delete_block(key)

    @precondition(lambda self: self.pending)
    @rule(data=st.data())
    def deliver(self, data: st.DataObject) -> None:
        obj = data.draw(st.sampled_from(sorted(self.pending)))
        del self.pending[obj]
        self._deliver(obj)
        self.delivered.add(obj)

    @precondition(lambda self: self.delivered)
    @rule(data=st.data())
    def duplicate(self, data: st.DataObject) -> None:
        self._deliver(data.draw(st.sampled_from(sorted(self.delivered))))

    @precondition(lambda self: self.pending)
    @rule(data=st.data())
    def drop(self, data: st.DataObject) -> None:
        obj = data.draw(st.sampled_from(sorted(self.pending)))
        self.dropped[obj] = self.pending.pop(obj)

    def _relist(self) -> None:
        self.mirror.relist(Kind.NODES, [parse_node(n) for n in self.nodes.values()])
        self.mirror.relist(Kind.PODS, [parse_pod(copy.deepcopy(p)) for p in self.pods.values()])
        self.mirror.relist(Kind.BLOCKS, [parse_block(copy.deepcopy(b)) for b in self.ipam.blocks.values()])
        self.pending.clear()
        self.dropped.clear()

    @rule()
    def resync(self) -> None:
        self._relist()
        self.mirror.mark_all_dirty()

    @rule()
    def restart_watcher(self) -> None:
        """A new watcher process: its memory of the mirror is rebuilt from Redis at its first call, then
        it relists (what a restarted watcher does); events delivered later are diffed against that."""
        self.mirror.memory.clear()
        self._relist()

    # -- the workers and the clock ---------------------------------------------------------------------

    @rule()
    def validate(self) -> None:
        for s in range(SHARDS):
            validate_shard(s, client=self.redis, keys=KEYS, clock=self.clock)
        self._check_decisions()

    def _withheld_since(self) -> float | None:
        return min([*self.pending.values(), *self.dropped.values()], default=None)

    @rule(dt=st.sampled_from([0.5, 3.0, GRACE / 2, GRACE + 0.5]))
    def advance(self, dt: float) -> None:
        since = self._withheld_since()
        if since is not None and self.clock.now() + dt - since >= GRACE:
            return  # the assumption in the docstring: no event is withheld for a grace period
        self.clock.advance(dt)

    @rule()
    def resync_and_check(self) -> None:
        """After a full resync and a validation, every leak is a candidate or decided."""
        self.resync()
        self.validate()
        cands: set[str] = set()
        decided: set[str] = set()
        for s in range(SHARDS):
            cands |= {f.decode() for f in self.redis.hkeys(KEYS.cand(s))}
            decided |= {f.decode() for f in self.redis.hkeys(KEYS.decided(s))}
        for a in self.allocs.values():
            if a.in_use:
                assert a.alloc_id not in decided | self.decided, a
                continue
            if a.node in self.nodes:
                assert a.alloc_id in cands | decided | self.decided, (
                    f"leak neither candidate nor decided: {a}"
                )
            else:
                assert a.alloc_id in decided | self.decided, f"leak on a gone node not decided: {a}"

    # -- invariants ------------------------------------------------------------------------------------

    def _check_decisions(self) -> None:
        entries = self.redis.xrange(KEYS.decisions, min=f"({self.last_id}")
        for entry_id, fields in entries:
            self.last_id = entry_id.decode()
            d = decode_decision(fields[b"d"])
            self.decided.add(d.alloc_id)
            a = self.allocs.get(d.alloc_id)
            if a is None:
                continue  # released by CNI DEL since: a decision for it frees nothing
            assert not a.in_use, f"decision for an allocation in use: {d}"
            assert a.leaked_at is not None
            if d.node_exists:
                # Judged as on a live node: the grace period must have passed, whether or not the node has
                # been deleted since in the model (its deletion may not have reached the mirror yet).
                assert a.node in self.nodes or a.node in self.deleted_nodes, d
                assert d.first_seen >= a.leaked_at, (d, a)
                assert d.decided_at - a.leaked_at > GRACE, f"decided within the grace period: {d} {a}"
            else:
                assert a.node not in self.nodes, f"node gone in the mirror, live in the model: {d}"


def test_the_pipeline_never_decides_an_allocation_in_use(client: redis.Redis) -> None:
    run_state_machine_as_test(
        lambda: Pipeline(client),
        settings=settings(
            max_examples=50,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
