"""A pod being deleted whose Calico CNI annotation has been blanked: CNI DEL has run, its IP is free.

Calico's `IsFinished` says so too, but its slim pod cache drops the deletion timestamp, so Calico keeps
such an IP until the pod object goes.  ipamgc mirrors the deletion timestamp and releases the IP after the
grace period (`pod-terminated`).  The pod here is held terminating by a finalizer, through the simulated
API server, which keeps the server-owned deletion timestamp across the annotation's update.
"""

from __future__ import annotations

from tests.leader.conftest import GRACE, Env
from workers.audit import Result


def test_a_terminating_pod_with_its_cni_annotation_blanked_loses_its_ip_after_grace(env: Env) -> None:
    sim = env.sim
    sim.add_node("node-a")
    [ip] = sim.create_pod("ns", "web-0", "node-a")
    store = env.server.store
    store.patch("pods", "ns", "web-0", {"metadata": {"finalizers": ["example.com/hold"]}})
    env.decide()
    lead = env.leader()
    store.delete("pods", "ns", "web-0")  # terminating, held by its finalizer
    assert store.get("pods", "ns", "web-0")["metadata"]["deletionTimestamp"]
    env.decide()
    lead.step()
    assert env.audit() == []  # being deleted, annotation still set: in use
    # CNI DEL ran (the sandbox is gone) and blanked the annotation; its IP release did not reach IPAM.
    sim.truth.stop_using(ip, env.clock.now())
    store.patch("pods", "ns", "web-0", {"metadata": {"annotations": {"cni.projectcalico.org/podIP": ""}}})
    assert store.get("pods", "ns", "web-0")["metadata"]["deletionTimestamp"]  # kept by the server
    env.decide()
    env.clock.advance(GRACE)
    assert env.decide() == 0  # a candidate: not before the grace period is over
    env.clock.advance(1.0)
    assert env.decide() == 1
    lead.step()
    [rec] = env.audit()
    assert (rec.result, rec.ip, rec.evidence["recheck"]["reason"]) == (Result.RELEASED, ip, "pod-terminated")
    assert sim.truth.violations == [] and sim.truth.leaked_ips() == set()
