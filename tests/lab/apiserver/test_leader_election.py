"""Lease-based leader election between two processes, failing over when the leader is killed.

The collector's replicas elect a leader with the official client's
``kubernetes.leaderelection`` on a coordination.k8s.io/v1 Lease. This runs two real
candidate processes (``leader_candidate.py``) against the simulated API server, kills the
leader with SIGKILL (no chance to release anything) and checks that the survivor takes
over once the lease has expired, never while it is still held, and that every Lease update
was a resourceVersion-conditional PUT (what makes two candidates unable to both win).

The client's ``Config`` rejects a retry period under one second, so the timings are the
shortest it accepts with some slack for a loaded machine: the leader renews about every
second and a follower takes over a lease it has seen unchanged for three.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from lab.apiserver.apiserver import SimApiServer
from lab.apiserver.store import JsonObj
from tests.lab.apiserver.leader_candidate import user_agent
from tests.polling import wait_until

NAMESPACE = "kube-system"
LEASE_NAME = "ipamgc-test"
LEASE_DURATION = 3  # seconds; an int, as the client's LeaseLock requires
RENEW_DEADLINE = 2.0
RETRY_PERIOD = 1.0  # the smallest the client's leaderelection Config accepts
#: Clock slack between the test's hook timestamps and the candidates' own timing.
SLACK = 0.1
CANDIDATE = Path(__file__).with_name("leader_candidate.py")


@dataclass
class Candidate:
    """A running candidate process and the files its stdout and stderr go to."""

    identity: str
    proc: subprocess.Popen[bytes]
    out: Path
    err: Path

    def events(self, what: str) -> list[float]:
        """Monotonic times of the candidate's complete ``what`` lines ("leading"/"stopped")."""
        lines = self.out.read_text().split("\n")[:-1]  # the last item is "" or a partial line
        words = (line.split() for line in lines)
        return [float(w[2]) for w in words if len(w) == 3 and w[:2] == [what, self.identity]]

    def leading_since(self) -> float | None:
        """When the candidate started leading, if it has."""
        times = self.events("leading")
        return times[0] if times else None

    def kill(self) -> float:
        """SIGKILL the process, reap it, and return the monotonic time it was known dead."""
        self.proc.kill()
        self.proc.wait(timeout=10)
        return time.monotonic()


@dataclass(frozen=True)
class LeaseCommit:
    """One committed write of the Lease, as the store's commit hook saw it."""

    at: float
    type: str
    holder: str | None
    old_rv: int | None
    rv: int


@pytest.fixture
def spawn(server: SimApiServer, tmp_path: Path) -> Iterator[Callable[[str], Candidate]]:
    """Start candidates against ``server``; every one is killed and reaped at teardown."""
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
    started: list[Candidate] = []

    def start(identity: str) -> Candidate:
        out, err = tmp_path / f"{identity}.out", tmp_path / f"{identity}.err"
        args = [str(CANDIDATE), str(kubeconfig), identity, NAMESPACE, LEASE_NAME]
        args += [str(LEASE_DURATION), str(RENEW_DEADLINE), str(RETRY_PERIOD)]
        with out.open("wb") as stdout, err.open("wb") as stderr:  # the child keeps its own copies
            proc = subprocess.Popen(
                [sys.executable, *args], stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr
            )
        started.append(Candidate(identity, proc, out, err))
        return started[-1]

    try:
        yield start
    finally:
        for cand in started:
            if cand.proc.poll() is None:
                cand.proc.kill()
        for cand in started:
            cand.proc.wait(timeout=10)
            # captured by pytest and shown only if the test failed
            print(f"--- {cand.identity} (exit {cand.proc.returncode})")
            print(cand.out.read_text() + cand.err.read_text())


@pytest.fixture
def lease_commits(server: SimApiServer) -> Iterator[list[LeaseCommit]]:
    """Every committed write of the test Lease, in commit order, via a store commit hook."""
    commits: list[LeaseCommit] = []

    def hook(plural: str, etype: str, old: JsonObj | None, new: JsonObj | None) -> None:
        if plural != "leases" or new is None or new["metadata"]["name"] != LEASE_NAME:
            return
        old_rv = int(old["metadata"]["resourceVersion"]) if old else None
        holder = (new.get("spec") or {}).get("holderIdentity")
        commits.append(
            LeaseCommit(time.monotonic(), etype, holder, old_rv, int(new["metadata"]["resourceVersion"]))
        )

    server.store.add_hook(hook)
    try:
        yield commits
    finally:
        server.store.remove_hook(hook)


def test_lease_fails_over_to_the_survivor_when_the_leader_is_killed(
    server: SimApiServer, spawn: Callable[[str], Candidate], lease_commits: list[LeaseCommit]
) -> None:
    a, b = spawn("candidate-a"), spawn("candidate-b")

    # exactly one of them leads
    wait_until(lambda: a.leading_since() or b.leading_since(), timeout=15)
    leaders = [c for c in (a, b) if c.leading_since() is not None]
    assert len(leaders) == 1, [c.identity for c in leaders]
    leader, follower = leaders[0], (b if leaders[0] is a else a)

    # let the leader renew and the follower see it hold the lease, then check nothing changed
    def requests_by(cand: Candidate, method: str) -> int:
        found = server.find_requests(method=method, resource="leases", name=LEASE_NAME, status=200)
        return sum(r.user_agent == user_agent(cand.identity) for r in found)

    wait_until(lambda: requests_by(leader, "PUT") >= 2 and requests_by(follower, "GET") >= 2, timeout=10)
    assert follower.leading_since() is None
    lease = server.store.get("leases", NAMESPACE, LEASE_NAME)
    assert lease["spec"]["holderIdentity"] == leader.identity
    assert lease["spec"]["leaseDurationSeconds"] == LEASE_DURATION

    # SIGKILL the leader: the follower takes over once the lease it last saw renewed expires
    killed_at = leader.kill()
    took_over_at = wait_until(follower.leading_since, timeout=LEASE_DURATION + 2 * RETRY_PERIOD + 2)
    assert took_over_at > killed_at  # the two leadership intervals do not overlap
    assert server.store.get("leases", NAMESPACE, LEASE_NAME)["spec"]["holderIdentity"] == follower.identity
    follower.kill()
    assert follower.events("stopped") == [] and leader.events("stopped") == []

    # the Lease changed hands exactly once, after the kill, and only once it had expired
    holders = [c.holder for c in lease_commits]
    handover = holders.index(follower.identity)
    assert holders == [leader.identity] * handover + [follower.identity] * (len(holders) - handover)
    last_renewal, takeover = lease_commits[handover - 1], lease_commits[handover]
    assert takeover.at > killed_at
    assert takeover.at - last_renewal.at >= LEASE_DURATION - SLACK
    assert took_over_at >= takeover.at - SLACK

    # every Lease update was a PUT conditional on the version it replaced (no blind writes):
    # the successful ones match the commits one for one
    puts = server.find_requests(method="PUT", resource="leases", name=LEASE_NAME)
    assert puts and all(p.precondition for p in puts)
    assert lease_commits[0].type == "ADDED" and lease_commits[0].holder == leader.identity
    assert all(c.type == "MODIFIED" for c in lease_commits[1:])
    modified_from = sorted(c.old_rv or 0 for c in lease_commits[1:])

    def preconditions_of_successful_puts() -> list[int]:
        ok = server.find_requests(method="PUT", resource="leases", name=LEASE_NAME, status=200)
        return sorted(int(p.precondition or 0) for p in ok)

    # (a PUT committed just as its sender was killed can reach the log a moment later)
    wait_until(lambda: preconditions_of_successful_puts() == modified_from, timeout=2)
    takeover_puts = server.find_requests(
        method="PUT", status=200, user_agent=user_agent(follower.identity), precondition=str(last_renewal.rv)
    )
    assert len(takeover_puts) == 1
