"""After the heal, a run is judged on the simulated cluster's ground truth: every leak released in time,
no IP in use released, blocks, handles and affinities consistent (what Calico's library would leave
after an interrupted write tolerated), no write by a stale leader.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable

import redis

from ipamgc.supervisor import RESTART_BACKOFF_MIN_SECONDS
from lab.apiserver.apiserver import SimApiServer
from lab.apiserver.store import SimApiError
from lab.chaos.evidence import keep_evidence
from lab.chaos.schedule import CALICO_IPAM, WRITES
from lab.chaos.state import RunState
from shared.consistency import check_consistency
from shared.model import sanitize_handle
from shared.names import affinity_name, handle_name
from shared.netaddr import IPAddress, cidr_to_name, name_to_cidr, parse_ip, parse_network
from shared.shard import DEFAULT_SHARDS
from shared.snapshot import build_inventory

log = logging.getLogger(__name__)


class Judge:
    """The judgement of one run, written into its report."""

    def __init__(self, run: RunState) -> None:
        self.run = run

    def heal_and_judge(self, server: SimApiServer) -> None:
        opts = self.run.opts
        assert self.run.stack is not None
        # Heal: every component runs again now (a supervisor's back-off after our kills is not the
        # system's own latency), and a frozen leader is thawed.
        for comp in self.run.stack.supervisor.components.values():
            comp.backoff = RESTART_BACKOFF_MIN_SECONDS
            comp.next_start = 0.0
            if comp.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(comp.pid, signal.SIGCONT)
        self.run.poll()
        healed = time.time()
        self.run.note("healed", f"{len(self.run.sim.truth.leaked_ips())} leaks outstanding")
        # Every leak released, and every node deleted by node churn freed of its IPs, blocks and
        # affinities (`lab.chaos.nodes`), within grace + settle of the heal.
        deadline = time.monotonic() + opts.grace + opts.settle_seconds
        while time.monotonic() < deadline:
            nodes_freed = self.run.node_watch.poll()
            if nodes_freed and not self.run.sim.truth.leaked_ips():
                break
            self.run.poll()
            self.run.stop.wait(0.1)
        self.run.node_watch.judge(self.run.report, healed, healed + opts.grace + opts.settle_seconds)
        if self.run.report.nodes_deleted:
            self.run.note(
                "nodes-judged",
                f"{self.run.report.nodes_freed} of {self.run.report.nodes_deleted} deleted nodes freed, the "
                f"last {self.run.report.node_max_latency}s after due ({self.run.report.node_part_latency})",
            )
        truth = self.run.sim.truth
        released = truth.released_leaks()
        self.run.report.leaks_released = len(released)
        self.run.report.leaks_outstanding = sorted(truth.leaked_ips())
        self.run.report.leaks_injected = len(released) + len(self.run.report.leaks_outstanding)
        latencies = truth.release_latencies()
        self.run.report.max_latency = round(max(latencies, default=0.0), 2)
        self.run.report.max_after_heal = round(
            max((u.freed_at or 0.0) - healed for u in released) if released else 0.0, 2
        )
        self.run.note(
            "judged", f"{len(released)} released, {len(self.run.report.leaks_outstanding)} outstanding"
        )
        if self.run.report.leaks_outstanding:
            self.run.note("diagnosis", self._diagnose())
            assert self.run.client is not None  # the run's Redis goes with the run: keep what it knows
            kept = keep_evidence(
                self.run.client,
                self.run.keys,
                self.run.report.leaks_outstanding,
                DEFAULT_SHARDS,
                self.run.log_dir / "evidence.json",
            )
            self.run.note("evidence", kept)
        # Handles are decremented right after their block's write: let the last ones land.
        ok = self.run.wait_for(lambda: not self._judge_consistency(server), 5.0, 0.2)
        self.run.report.inconsistencies = self._judge_consistency(server)
        if not ok:
            self.run.note("inconsistent", "; ".join(self.run.report.inconsistencies[:5]))
            failed = [
                f"{r.method} {r.resource}/{r.name} {r.status} ({r.user_agent})"
                for r in server.requests
                if r.resource in CALICO_IPAM
                and r.method in WRITES
                and r.status >= 400
                and r.status not in (404, 409)
            ]
            self.run.note("failed-ipam-writes", "; ".join(failed[-20:]) or "none")
        self.run.report.violations = [
            f"{v.ip} of {v.owner} at {v.released_at:.3f}: {v.detail}" for v in truth.violations
        ]
        self.run.report.unexpected = [f"{ip} at {at:.3f}" for ip, at in truth.unexpected]
        self.run.report.stale_writes = self._stale_writes(server)
        self.run.note("done", "ok" if self.run.report.ok() else "; ".join(self.run.report.problems()[:5]))

    def _diagnose(self) -> str:
        """Per shard with anything pending: queued flag (ms left), dirty, in-flight, due, revalidation."""
        assert self.run.client is not None
        out = []
        try:
            for sh in range(DEFAULT_SHARDS):
                pipe = self.run.client.pipeline(transaction=False)
                pipe.pttl(self.run.keys.queued(sh))
                pipe.scard(self.run.keys.dirty(sh))
                pipe.zcard(self.run.keys.inflight(sh))
                pipe.zcard(self.run.keys.due(sh))
                pipe.get(self.run.keys.revalidate(sh))
                ttl, dirty, inflight, due, revalidating = pipe.execute()
                if ttl > 0 or dirty or inflight or due or revalidating:
                    left = f", revalidation pass {revalidating!r}" if revalidating else ""
                    out.append(
                        f"shard {sh}: queued {ttl}ms, dirty {dirty}, in-flight {inflight}, due {due}{left}"
                    )
        except redis.RedisError as exc:
            out.append(f"Redis: {exc}")
        return "; ".join(out) or "nothing pending in any shard"

    def _judge_consistency(self, server: SimApiServer) -> list[str]:
        """Blocks, handles and affinities agree.  One disagreement is Calico's library semantics, not a
        bug: the leader writes the block, then decrements the handles (as `ReleaseIPs` does), so a leader
        killed between the two, or a handle write the API failed ambiguously, leaves those handles
        counting IPs the block no longer holds — the safe direction (nothing is ever released on a
        handle's count).  Tolerated only in the blocks such a write touched, and recorded."""
        problems = check_consistency(build_inventory(self.run.sim.export()["items"]))
        handles, blocks, ips = self._interrupted_writes(server)
        left: list[str] = []
        tolerated: list[str] = []
        for p in problems:
            ok = False
            if p.kind == "handle-count" and _over_counted(p.detail):
                cidr = p.detail.rsplit(": handle says", 1)[0]
                net = parse_network(cidr)
                ok = (
                    p.subject in handles
                    or cidr in blocks
                    or any(ip.version == net.version and ip in net for ip in ips)
                )
            elif p.kind == "affinity-missing":
                ok = self._release_interrupted(server, *p.subject.rsplit(" ", 1))
            (tolerated if ok else left).append(str(p))
        self.run.report.tolerated = tolerated
        return left

    def _interrupted_writes(self, server: SimApiServer) -> tuple[set[str], set[str], list[IPAddress]]:
        """What a leader may have left over-counted: handles whose write the API failed ambiguously (500,
        504: perhaps applied, so not repeated); blocks whose write a kill landed on (their handles were
        not decremented); and the IPs of a handle whose write a kill landed on (the other handles of
        their blocks were not decremented either)."""
        handles = {
            str(r.name)
            for r in server.requests
            if r.resource == "ipamhandles"
            and r.method in ("PUT", "DELETE")
            and r.user_agent.startswith("ipamgc-leader/")
            and r.status >= 500
            and r.status != 503
        }
        blocks: set[str] = set()
        ips: list[IPAddress] = []
        for resource, name in self.run.write_kills:
            if resource == "ipamblocks":
                with contextlib.suppress(ValueError):
                    blocks.add(str(name_to_cidr(name)))
                continue
            handles.add(name)
            for lives in self.run.sim.truth.usages.values():
                ips += [parse_ip(u.ip) for u in lives if handle_name(sanitize_handle(u.handle)) == name]
        return handles, blocks, ips

    def _release_interrupted(self, server: SimApiServer, node: str, cidr: str) -> bool:
        """A block affinity release the API failed midway (Calico's `ReleaseBlockAffinity` leaves the same
        state): the affinity is `pendingDeletion`, a leader write on the block or affinity failed, and the
        leader finishes it at its next empty-block or deleted-node pass."""
        names = {cidr_to_name(cidr), affinity_name(node, parse_network(cidr))}
        try:
            state = self.run.store.get("blockaffinities", None, affinity_name(node, parse_network(cidr)))[
                "spec"
            ]
        except SimApiError:
            return False
        failed = any(
            r.name in names
            and r.method in WRITES
            and r.status >= 429
            and r.user_agent.startswith("ipamgc-leader/")
            for r in server.requests
        )
        return state.get("state") == "pendingDeletion" and failed

    def _stale_writes(self, server: SimApiServer) -> list[str]:
        """IPAM writes a leader made after it went stale (takeover or pause): there must be none."""
        out: list[str] = []
        for st in self.run.stale:
            for r in server.requests:
                if (
                    r.method in WRITES
                    and r.resource in CALICO_IPAM
                    and r.user_agent == f"ipamgc-leader/{st.identity}"
                    and st.since < r.timestamp < (st.until or time.time())
                    and r.status < 300
                ):
                    out.append(f"{st.identity}: {r.method} {r.resource}/{r.name} ({r.status})")
        return out


def _safe_int(read: Callable[[], object]) -> int:
    try:
        value = read()
    except redis.RedisError:
        return -1
    return int(value) if isinstance(value, int) else -1


def _over_counted(detail: str) -> bool:
    """`<cidr>: handle says N, block holds M` with N > M."""
    try:
        says = int(detail.split("handle says ", 1)[1].split(",", 1)[0])
        holds = int(detail.rsplit("block holds ", 1)[1])
    except (IndexError, ValueError):
        return False
    return says > holds
