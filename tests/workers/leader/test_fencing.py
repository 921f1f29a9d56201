"""Two leaders: the stale one writes nothing, and no IP is released twice.

First deterministically — a second leader is elected (new epoch) while the first is in the middle of a
pass, between its re-check and its first write — then with the real election: two `run_leader`
instances on the same Redis and simulated cluster, the leader's Lease taken over by the standby.
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from kubeio.election import Elector, Leadership
from shared.config import Settings
from tests.fixtures.leader import CALICO_IPAM, Env, leader_settings
from tests.polling import wait_until
from workers.leader.audit import Result
from workers.leader.election import LostLeadership
from workers.leader.loop import EXIT_LOST, EXIT_STOPPED, Leader, run_leader
from workers.leader.settings import LeaderSettings


def _kill_node(env: Env, node: str, pods: int) -> set[str]:
    sim = env.sim
    for i in range(pods):
        sim.create_pod("ns", f"{node}-p{i}", node)
    env.decide()
    before = sim.truth.leaked_ips()
    sim.leak_node_deleted(node)
    leaked = sim.truth.leaked_ips() - before
    assert env.decide() == len(leaked)
    return leaked


class _ElectedMidPass:
    """The first leader's API; on its first live lookup (the re-check), another leader is elected."""

    def __init__(self, api: Any, elect: Any) -> None:
        self.api = api
        self.elect = elect
        self.fired = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.api, name)

    def get_node(self, name: str) -> Any:
        if not self.fired:
            self.fired = True
            self.elect()
        return self.api.get_node(name)


def test_a_leader_whose_epoch_went_stale_mid_pass_writes_nothing(env: Env) -> None:
    env.sim.add_node("node-a")
    env.sim.add_node("node-dead")
    leaked = _kill_node(env, "node-dead", 3)
    successor: list[Leader] = []
    api = _ElectedMidPass(env.api("leader-a"), lambda: successor.append(env.leader("leader-b")))
    first = Leader(leader_settings(), env.redis, api, Leadership.granted("leader-a"), clock=env.clock)
    first.start()
    env.server.clear_requests()

    assert first.serve(threading.Event()) == EXIT_LOST
    assert env.writes("leader-a") == []
    stale = [r for r in env.audit() if r.leader == "leader-a"]
    assert {r.ip for r in stale} == leaked
    assert all(r.result is Result.STALE_EPOCH and r.epoch == 1 for r in stale)

    [second] = successor
    assert second.fence.epoch == 2
    second.step()  # it reclaimed the entries the first had read (XAUTOCLAIM on election)
    released = Counter(r.ip for r in env.audit() if r.result is Result.RELEASED and r.ip)
    assert set(released) == leaked and set(released.values()) == {1}
    assert {r.epoch for r in env.audit() if r.leader == "leader-b"} == {2}
    assert env.pending() == 0
    assert env.sim.truth.violations == [] and env.sim.truth.leaked_ips() == set()


def _settings(env: Env, identity: str, kubeconfig: Path) -> LeaderSettings:
    pool = env.redis.connection_pool.connection_kwargs
    base = Settings(
        redis_url=f"redis://{pool['host']}:{pool['port']}/0",
        kubeconfig=str(kubeconfig),
        election_lease_seconds=3,
        election_renew_seconds=2.0,
        election_retry_seconds=1.0,  # the shortest the client's leaderelection accepts
    )
    return leader_settings(base=base, identity=identity, idle_seconds=0.05)


def test_two_elected_leaders_racing_for_the_lease(env: Env, tmp_path: Path) -> None:
    env.sim.add_node("node-a")
    env.sim.add_node("node-dead-1")
    env.sim.add_node("node-dead-2")
    first_batch = _kill_node(env, "node-dead-1", 2)
    kubeconfig = env.server.write_kubeconfig(tmp_path / "kubeconfig")
    stops = {"leader-a": threading.Event(), "leader-b": threading.Event()}
    codes: dict[str, int] = {}

    def run(identity: str) -> None:
        codes[identity] = run_leader(_settings(env, identity, kubeconfig), stops[identity])

    threads = {i: threading.Thread(target=run, args=(i,), name=i) for i in stops}
    threads["leader-a"].start()
    try:
        released = lambda: {r.ip for r in env.audit() if r.result is Result.RELEASED and r.ip}  # noqa: E731
        wait_until(lambda: released() >= first_batch)
        threads["leader-b"].start()
        wait_until(
            lambda: env.server.find_requests(
                method="GET", resource="leases", user_agent="ipamgc-leader/leader-b"
            )
        )

        # The standby takes the Lease over (as it would once leader-a's renewals stopped reaching the
        # server): leader-a must stop writing at once, leader-b leads with a newer epoch.
        lease = env.server.store.get("leases", "kube-system", "ipamgc-leader")
        lease["spec"]["holderIdentity"] = "leader-b"
        env.server.store.replace("leases", "kube-system", "ipamgc-leader", lease)
        wait_until(lambda: env.redis.hget(env.keys.leader("ipamgc-leader"), "identity") == b"leader-b")
        taken_over = env.server.store.get("leases", "kube-system", "ipamgc-leader")["metadata"][
            "resourceVersion"
        ]
        second_batch = _kill_node(env, "node-dead-2", 2)
        wait_until(lambda: released() >= first_batch | second_batch)
        threads["leader-a"].join(timeout=10)
        assert codes.get("leader-a") == EXIT_LOST
    finally:
        for stop in stops.values():
            stop.set()
        for t in threads.values():
            if t.is_alive() or t.ident is not None:
                t.join(timeout=10)
    assert codes["leader-b"] == EXIT_STOPPED

    # Request log: every write of leader-a comes before leader-b took the Lease over, and leader-a
    # released only the first batch.
    a_writes = env.writes("leader-a")
    b_writes = env.writes("leader-b")
    assert a_writes and b_writes
    assert max(r.timestamp for r in a_writes) < min(r.timestamp for r in b_writes)
    assert all(
        r.resource in CALICO_IPAM and r.precondition for r in a_writes + b_writes if r.method != "POST"
    )
    records = env.audit()
    by_leader = {
        who: {r.ip for r in records if r.leader == who and r.result is Result.RELEASED and r.ip}
        for who in stops
    }
    assert by_leader == {"leader-a": first_batch, "leader-b": second_batch}
    assert {r.epoch for r in records if r.leader == "leader-a"} == {1}
    assert {r.epoch for r in records if r.leader == "leader-b"} == {2}
    released_count = Counter(r.ip for r in records if r.result is Result.RELEASED and r.ip)
    assert set(released_count.values()) == {1}  # no double release
    assert env.sim.truth.violations == [] and env.sim.truth.leaked_ips() == set()
    assert int(taken_over) > 0
    # leader-b stopped gracefully: it gave the Lease up, so a standby need not wait for it to expire
    assert not env.server.store.get("leases", "kube-system", "ipamgc-leader")["spec"].get("holderIdentity")


class _Candidate:
    def __init__(self) -> None:
        self.ok = True
        self.calls = 0

    def try_acquire_or_renew(self) -> bool:
        self.calls += 1
        return self.ok


def test_a_leader_whose_renewals_fail_stops_itself_at_the_renew_deadline(env: Env) -> None:
    now = [0.0]
    leadership = Leadership("leader-a", monotonic=lambda: now[0])
    candidate = _Candidate()
    elector = Elector(candidate, leadership, renew_seconds=2.0, retry_seconds=0.01)
    halt = threading.Event()
    thread = threading.Thread(target=elector.run, args=(halt,))
    thread.start()
    try:
        wait_until(leadership.held)
        lead = Leader(leader_settings(), env.redis, env.api("leader-a"), leadership, clock=env.clock)
        lead.start()
        candidate.ok = False  # the API server stops answering our renewals
        calls = candidate.calls
        wait_until(lambda: candidate.calls > calls + 3)
        now[0] = 1.9  # before the deadline, measured from the start of the last successful renewal
        assert leadership.held() and not leadership.lost.is_set()
        now[0] = 2.0
        wait_until(leadership.lost.is_set)
        assert not leadership.held()
        with pytest.raises(LostLeadership):
            lead.fence.check()
        env.server.clear_requests()
        assert lead.serve(threading.Event()) == EXIT_LOST
        assert env.server.requests == []  # not one more request, let alone a write
    finally:
        halt.set()
        thread.join()
