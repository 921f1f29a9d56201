"""A pod being deleted whose Calico CNI annotation has been blanked keeps its IP, as in Calico.

Calico's `IsFinished` would call such a pod finished, but Calico judges candidates from its informer
cache, whose slim pods carry no deletion timestamp (`PodTransformer`): the pod still reports its IP in its
status, so the IP is valid and never becomes a candidate; it goes when the pod object goes.  ipamgc's
workers judge the mirror as Calico judges its cache.  The pod here is held terminating by a finalizer,
through the simulated API server, which keeps the server-owned deletion timestamp across the
annotation's update.
"""

from __future__ import annotations

from shared.shard import shard_of
from tests.fixtures.leader import GRACE, Env
from workers.leader.audit import Result


def test_a_terminating_pod_with_its_cni_annotation_blanked_keeps_its_ip_until_the_pod_goes(env: Env) -> None:
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
    s = shard_of("node-a")
    assert env.redis.hlen(env.keys.cand(s)) == 0  # valid in Calico's view: not even a candidate
    env.clock.advance(3 * GRACE)
    assert env.decide() == 0
    lead.step()
    assert env.audit() == [] and ip in sim.truth.leaked_ips()

    # The kubelet confirms (grace 0: still held by the finalizer, as on a real server), the finalizer goes,
    # then the pod object: now the IP is a leak, released after the grace period.
    store.delete("pods", "ns", "web-0", grace_period_seconds=0)
    assert store.get("pods", "ns", "web-0")["metadata"]["deletionGracePeriodSeconds"] == 0
    store.patch("pods", "ns", "web-0", {"metadata": {"finalizers": []}})
    assert not any(p["metadata"]["name"] == "web-0" for p in store.list("pods", "ns")["items"])
    env.decide()
    env.clock.advance(GRACE + 1)
    assert env.decide() == 1
    lead.step()
    [rec] = env.audit()
    assert (rec.result, rec.ip, rec.evidence["recheck"]["reason"]) == (Result.RELEASED, ip, "pod-missing")
    assert sim.truth.violations == [] and sim.truth.leaked_ips() == set()
