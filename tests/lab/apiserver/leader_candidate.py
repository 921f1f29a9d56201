"""One leader-election candidate, run as its own process by ``test_leader_election.py``.

Leader election only matters between processes (one of them dies, the other must take
over), so the test runs each candidate as a separate ``python`` process using the
official client's ``kubernetes.leaderelection`` with a ``LeaseLock``, against the
simulated API server described by a kubeconfig. It imports nothing from this project.

Usage::

    python leader_candidate.py KUBECONFIG IDENTITY NAMESPACE NAME LEASE RENEW RETRY

It prints ``leading IDENTITY T`` when it starts leading and ``stopped IDENTITY T`` when it
stops, ``T`` being ``time.monotonic()`` (one clock for every process on the machine), and
logs the election to stderr. Requests carry the user agent ``leader-candidate/IDENTITY``.
It exits on its own when its parent goes away, so a killed test run leaves no orphans.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time

from kubernetes import config
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

#: Even a test that hangs must not leave candidates behind: they give up after this long.
MAX_LIFETIME = 120.0
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def user_agent(identity: str) -> str:
    """The User-Agent a candidate's requests carry (so the server's log tells them apart)."""
    return f"leader-candidate/{identity}"


def _say(what: str, identity: str) -> None:
    print(f"{what} {identity} {time.monotonic():.6f}", flush=True)


def _exit_with_parent(parent: int) -> None:
    """The kernel kills this process when its parent dies (Linux's `PR_SET_PDEATHSIG`), and a timer
    ends it after `MAX_LIFETIME`: nothing polls."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0 or os.getppid() != parent:
        os._exit(3)  # no such call, or the parent died before it was made
    timer = threading.Timer(MAX_LIFETIME, os._exit, args=(3,))
    timer.daemon = True
    timer.start()


def main(argv: list[str]) -> int:
    kubeconfig, identity, namespace, name, lease, renew, retry = argv
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format=f"%(asctime)s {identity} %(name)s: %(message)s"
    )
    _exit_with_parent(os.getppid())
    config.load_kube_config(config_file=kubeconfig)
    lock = LeaseLock(name, namespace, identity)
    lock.api_instance.api_client.user_agent = user_agent(identity)
    election = electionconfig.Config(
        lock,
        lease_duration=int(lease),  # the client writes it as str() and reads it back with int()
        renew_deadline=float(renew),
        retry_period=float(retry),
        onstarted_leading=lambda: _say("leading", identity),
        onstopped_leading=lambda: _say("stopped", identity),
    )
    leaderelection.LeaderElection(election).run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
