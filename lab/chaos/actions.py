"""Each fault of the schedule started on a running system (`FaultActions.apply`), and what ends it."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import redis

from lab.apiserver.apiserver import SimApiServer
from lab.apiserver.store import SimApiError
from lab.chaos.hooks import BlockBumper, ChurnDriver, Trigger
from lab.chaos.nodechurn import NodeChurnDriver, plan_for
from lab.chaos.nodes import LOOK_ALIKE_NODES
from lab.chaos.redisha import RedisHA
from lab.chaos.redisproc import RedisProcess
from lab.chaos.report import StaleLeader
from lab.chaos.schedule import LEADER_LEASE, LEASE_NAMESPACE, Fault
from lab.chaos.state import RunState
from lab.cluster.churn import Churn
from redisio.client import redis_client

log = logging.getLogger(__name__)


class FaultActions:
    """The faults of one run, applied to its state."""

    def __init__(self, run: RunState) -> None:
        self.run = run

    def apply(
        self, f: Fault, server: SimApiServer, redis_proc: RedisProcess | RedisHA, churn: ChurnDriver
    ) -> list[Callable[[], None]]:
        """Start fault `f`; returns what ends it."""
        undo: list[Callable[[], None]] = []
        if f.kind == "api-errors":
            ids = [
                self.run.faults.add(error_rate=f.param("p500"), error_code=500).id,
                self.run.faults.add(error_rate=f.param("p429"), error_code=429, retry_after=0.2).id,
                self.run.faults.add(error_rate=f.param("p503"), error_code=503).id,
            ]
            self.run.note(
                f.kind,
                f"500 @{f.param('p500')}, 429 @{f.param('p429')}, 503 @{f.param('p503')} for {f.length}s",
            )
            undo += [self._remover(i) for i in ids]
        elif f.kind == "latency":
            rule = self.run.faults.add(
                latency=f.param("seconds"), verbs=["get", "list", "update", "create", "delete"]
            )
            self.run.note(f.kind, f"+{f.param('seconds')}s on every request for {f.length}s")
            undo.append(self._remover(rule.id))
        elif f.kind == "drop-watches":
            rule = self.run.faults.add(drop_watch_rate=f.param("rate"))
            self.run.note(
                f.kind,
                f"{server.drop_watches()} watches cut, then {f.param('rate')} per event for {f.length}s",
            )
            undo.append(self._remover(rule.id))
        elif f.kind == "expire-410":
            server.compact()
            self.run.faults.add(expire=True, times=2)
            self.run.note(
                f.kind, f"history compacted, {server.drop_watches()} watches cut, next 2 watches answered 410"
            )
        elif f.kind == "conflict-storm":
            bumper = BlockBumper(self.run.sim, float(f.param("per_second")), self.run.opts.seed)
            bumper.start()
            self.run.note(
                f.kind, f"{f.param('per_second')} block writes/s by a concurrent writer for {f.length}s"
            )

            def end_storm() -> None:
                bumper.stop()
                self.run.note("conflict-storm-end", f"{bumper.bumps} blocks bumped")

            undo.append(end_storm)
        elif f.kind == "kill-watcher":
            self.run.note(f.kind, f"SIGKILL pid {self.run.kill('watcher')}")
        elif f.kind == "kill-worker":
            hunter = threading.Thread(
                target=self._hunt_worker,
                args=(f.length, redis_proc.url, str(f.param("point"))),
                name="chaos-hunter",
                daemon=True,
            )
            hunter.start()
            self.run.note("kill-worker-hunting", f"{f.param('point')}, for {f.length}s")
            undo.append(lambda: hunter.join(timeout=10))
        elif f.kind == "kill-leader":
            undo.append(self._disarm(f.kind, self._arm_leader_kill(f)))
        elif f.kind == "stale-leader":
            undo.append(self._disarm(f.kind, self._arm_stale_leader(f)))
        elif f.kind == "redis-rollback":
            snapshot = redis_proc.snapshot()
            self.run.note(f.kind, f"{len(snapshot)} keys snapshotted; Redis goes back to them in {f.length}s")

            def roll_back() -> None:
                n = redis_proc.rollback(snapshot)
                self.run.note(
                    "redis-rollback-end", f"{n} keys restored: {f.length}s of every writer's writes lost"
                )

            undo.append(roll_back)
        elif f.kind == "redis-restart":
            down = float(f.param("down"))
            self.run.note(f.kind, f"redis-server killed, back empty on port {redis_proc.port} after {down}s")
            redis_proc.restart_empty(down, self.run.stop)
        elif f.kind == "redis-flushall":
            assert self.run.client is not None
            keys = self.run.client.dbsize()
            self.run.client.flushall()
            self.run.note(f.kind, f"FLUSHALL: {keys} keys gone, the server still up")
        elif f.kind in ("redis-failover", "redis-failover-lossy"):
            undo.append(self._fail_over(f, redis_proc))
        elif f.kind == "redis-maxmemory":
            undo.append(self._limit_memory(f, redis_proc))
        elif f.kind == "node-churn":
            undo.append(self._churn_nodes(f, churn))
        elif f.kind == "scenario":
            with churn.lock:
                self.run.note(f.kind, self._scenario(str(f.param("name")), churn.churn))
        return undo

    def _churn_nodes(self, f: Fault, churn: ChurnDriver) -> Callable[[], None]:
        """Nodes replaced in a thread for the window; ended by waiting for the abrupt ones' pod GC."""
        window, replaced, abrupt = (
            float(f.param("window")),
            int(f.param("replaced")),
            float(f.param("abrupt")),
        )
        driver = NodeChurnDriver(self.run, churn, plan_for(self.run.opts, window, replaced, abrupt))
        self.run.node_churn = driver.node_churn
        driver.start()
        self.run.note(
            f.kind,
            f"{replaced} of {self.run.opts.nodes} nodes replaced over {window}s, {abrupt:.0%} abruptly",
        )
        return driver.finish

    def _fail_over(self, f: Fault, redis_proc: RedisProcess | RedisHA) -> Callable[[], None]:
        """The failover in a thread (it takes seconds; the run keeps supervising meanwhile); ended by
        joining it."""
        if not isinstance(redis_proc, RedisHA):
            raise RuntimeError(f"{f.kind} needs the run's Redis with Sentinel (RedisHA)")
        lag = float(f.param("lag", 0.0))
        how = f"replica cut off for {lag}s of writes, then the master killed" if lag else "SENTINEL FAILOVER"
        self.run.note(f.kind, how)

        def fail_over() -> None:
            try:
                detail = redis_proc.lossy_failover(lag) if lag else redis_proc.failover()
            except (redis.RedisError, RuntimeError, OSError) as exc:
                detail = f"failed: {exc}"
            self.run.note(f"{f.kind}-end", detail)

        thread = threading.Thread(target=fail_over, name="chaos-failover", daemon=True)
        thread.start()
        return lambda: thread.join(timeout=120)

    def _limit_memory(self, f: Fault, redis_proc: RedisProcess | RedisHA) -> Callable[[], None]:
        """`maxmemory` below the used memory on the master (`noeviction`, as deployed: every write that
        may grow the data is refused, `OOM command not allowed`) for `f.length` seconds, then as before.
        In a thread, after any failover under way (`RedisHA.exclusive`); ended by joining it."""
        exclusive = redis_proc.exclusive if isinstance(redis_proc, RedisHA) else contextlib.nullcontext()

        def limit() -> None:
            with exclusive:
                client = redis_client(redis_proc.url)
                try:
                    # Just after a failover a sentinel may not name the new master yet ("No master found").
                    self.run.wait_for(lambda: _answers(client), 15.0, 0.1)
                    self._limited(f, client)
                except redis.RedisError as exc:
                    self.run.note("redis-maxmemory-end", f"failed: {exc}")
                finally:
                    client.close()

        thread = threading.Thread(target=limit, name="chaos-maxmemory", daemon=True)
        thread.start()
        return lambda: thread.join(timeout=120)

    def _limited(self, f: Fault, client: redis.Redis) -> None:
        used = int(client.info("memory")["used_memory"])
        before = str(client.config_get("maxmemory").get("maxmemory") or "0")
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", max(1, used // 2))
        ooms = _oom_replies(client)
        self.run.note(f.kind, f"maxmemory {max(1, used // 2)} B, used {used} B, noeviction, for {f.length}s")
        try:
            self.run.stop.wait(f.length)
        finally:
            client.config_set("maxmemory", before)
        refused = _oom_replies(client) - ooms
        self.run.note("redis-maxmemory-end", f"maxmemory {before} again; {refused} writes refused (OOM)")

    def _remover(self, rule_id: int) -> Callable[[], None]:
        def remove() -> None:
            self.run.faults.remove(rule_id)

        return remove

    def _disarm(self, kind: str, trigger: Trigger) -> Callable[[], None]:
        def disarm() -> None:
            if self.run.faults.disarm(trigger):
                self.run.note(f"{kind}-not-fired", "no release request came while armed")

        return disarm

    def _hunt_worker(self, window: float, url: str, point: str) -> None:
        """SIGKILL a worker inside a shard job, seen through Redis MONITOR: `mid-batch` when it reads the
        records of ids it has just leased (HMGET alloc:{s}: only a shard job with a lease does that),
        `between-batches` when it reads the state at the top of its loop (no lease held).  The command's
        client port names the process (/proc).  Any worker at the end of the window."""
        workers = [n for n in self.run.stack_names() if n.startswith("worker-")]
        monitor = redis_client(url, socket_timeout=0.2)
        wanted = (
            f"HMGET {self.run.keys.alloc(0).split('{', 1)[0]}"
            if point == "mid-batch"
            else f"HMGET {self.run.keys.state} "
        )
        deadline = time.monotonic() + window
        try:
            with monitor.monitor() as m:  # type: ignore[no-untyped-call]
                ports = connection_owners({self.run.component(n).pid: n for n in workers})
                while time.monotonic() < deadline and not self.run.stop.is_set():
                    try:
                        cmd = m.next_command()
                    except (redis.TimeoutError, redis.ConnectionError):
                        continue
                    text = str(cmd.get("command", ""))
                    if not text.startswith(wanted):
                        continue
                    port = int(cmd.get("client_port") or 0)
                    if port not in ports:
                        ports = connection_owners({self.run.component(n).pid: n for n in workers})
                    name = ports.get(port)
                    if name is None:
                        continue
                    pid = self.run.kill(name)
                    self.run.note("kill-worker", f"SIGKILL {name} (pid {pid}) {point}: {self._leases()}")
                    return
        except redis.RedisError as exc:
            log.warning("worker hunt: %s", exc)
        finally:
            monitor.close()
        name = workers[self.run.rng.randrange(len(workers))]
        self.run.note(
            "kill-worker", f"SIGKILL {name} (pid {self.run.kill(name)}): no shard job seen in {window}s"
        )

    def _leases(self) -> str:
        assert self.run.client is not None
        try:
            pipe = self.run.client.pipeline(transaction=False)
            for sh in range(16):
                pipe.zcard(self.run.keys.inflight(sh))
            held = {sh: n for sh, n in enumerate(pipe.execute()) if n}
        except redis.RedisError as exc:
            return f"leases unknown ({exc})"
        return f"leased ids per shard {held}" if held else "no lease held"

    def _arm_leader_kill(self, f: Fault) -> Trigger:
        verb, resource = str(f.param("verb")), str(f.param("resource"))

        def fire(obj: str | None) -> None:
            name = self.run.active_leader()
            if name is None:
                return
            if verb == "update" and obj:  # the block (or its handle) written, the rest of the pass not
                self.run.write_kills.append((resource, obj))
            self.run.note(
                "kill-leader", f"SIGKILL {name} (pid {self.run.kill(name)}) on its `{verb} {resource}`"
            )

        self.run.note("kill-leader-armed", f"on the active leader's next `{verb} {resource}`")
        return self.run.faults.arm(verb, resource, fire)

    def _arm_stale_leader(self, f: Fault) -> Trigger:
        variant = str(f.param("variant"))

        def fire(_obj: str | None) -> None:
            old = self.run.active_leader()
            standby = next((n for n in ("leader-0", "leader-1") if n != old), None)
            if old is None or standby is None or self.run.component(standby).pid is None:
                self.run.note("stale-leader-skipped", "no standby running")
                return
            if variant == "takeover":
                self._hand_lease(standby)
                ok = self.run.wait_for(lambda: self.run.epoch_identity() == standby, 6.0)
                with self.run.lock:
                    self.run.stale.append(StaleLeader(old, self.run.component(old).pid, time.time()))
                self.run.note(
                    "stale-leader",
                    f"takeover: Lease handed to {standby} mid-release of {old}; new epoch "
                    f"{'taken' if ok else 'NOT taken'}; {old} resumes believing it leads",
                )
                return
            pid = self.run.kill(old, signal.SIGSTOP)
            self.run.note("stale-leader", f"pause: {old} (pid {pid}) frozen mid-release (SIGSTOP)")

            def thaw() -> None:
                ok = self.run.wait_for(lambda: self.run.epoch_identity() == standby, 10.0)
                with self.run.lock:
                    self.run.stale.append(StaleLeader(old, pid, time.time()))
                with contextlib.suppress(ProcessLookupError):
                    if pid is not None:
                        os.kill(pid, signal.SIGCONT)
                self.run.note("stale-leader-resumed", f"{old} thawed; {standby} leads: {ok}")

            threading.Thread(target=thaw, name="chaos-thaw", daemon=True).start()

        self.run.note("stale-leader-armed", f"{variant} on the active leader's next block read")
        return self.run.faults.arm("get", "ipamblocks", fire)

    def _hand_lease(self, identity: str) -> None:
        """The partition: the old leader's renewals stop counting, the Lease goes to `identity`."""
        for _ in range(20):
            lease = self.run.store.get("leases", LEASE_NAMESPACE, LEADER_LEASE)
            lease["spec"]["holderIdentity"] = identity
            try:
                self.run.store.replace("leases", LEASE_NAMESPACE, LEADER_LEASE, lease)
                return
            except SimApiError as exc:
                if exc.code != 409:
                    raise

    def _scenario(self, name: str, churn: Churn) -> str:
        sim = self.run.sim
        if name == "node-lost":
            # Not the look-alikes' nodes: a live pod whose allocation names node-00001 (#12257) keeps that
            # node "in use", so Calico's rules rightly keep its tunnel IP, which the truth would call leaked.
            leaving = self.run.node_churn.leaving if self.run.node_churn is not None else frozenset()
            candidates = sorted(sim.node_names - LOOK_ALIKE_NODES - leaving)
            if not candidates:
                return "node-lost: no node to lose"
            node = self.run.rng.choice(candidates)
            # The churn schedules pods on the nodes it knew at start: not on the lost one any more.
            churn._nodes = [n for n in churn._nodes if n != node]
            before = sim.truth.leaked_ips()
            sim.leak_node_deleted(node)
            return (
                f"node-lost: {node} deleted with its pods, {len(sim.truth.leaked_ips() - before)} IPs leaked"
            )
        if name == "fuel":
            leaked = []
            for _ in range(2):
                pod = sim.random_pod()
                if pod is not None:
                    leaked += sim.leak_pod_deleted_without_cni_del(*pod)
            return f"fuel: 2 pods deleted without CNI DEL, leaked {leaked}"
        key = sim.random_pod()
        if key is None:
            return f"{name}: no pod"
        if name == "ip-changed":
            return f"ip-changed: {key[0]}/{key[1]} got a new IP, leaked {sim.leak_ip_changed(*key)}"
        return f"terminal-pod: {key[0]}/{key[1]} finished, leaked {sim.leak_terminal_pod(*key)}"


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


def _oom_replies(client: redis.Redis) -> int:
    """How many commands the server has refused with OOM since it started (`INFO errorstats`)."""
    stat = client.info("errorstats").get("errorstat_OOM", {})
    return int(stat.get("count", 0)) if isinstance(stat, dict) else 0


def connection_owners(pids: dict[int | None, str]) -> dict[int, str]:
    """Local TCP port → the name of the process (among `pids`) that owns the socket (Linux /proc)."""
    inodes: dict[str, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                inodes[fields[9]] = int(fields[1].rsplit(":", 1)[1], 16)
    out: dict[int, str] = {}
    for pid, name in pids.items():
        if pid is None:
            continue
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("socket:[") and (port := inodes.get(link[8:-1])) is not None:
                        out[port] = name
    return out
