"""A Sentinel-managed Redis of the run's own (a master, one replica, three sentinels, all on 127.0.0.1), so
that a run may fail the master over, cleanly or losing the last writes (`redis-failover`,
`redis-failover-lossy`).

Every component and the harness's own clients are given its `redis+sentinel://` URL (`redisio/sentinel.py`)
and must follow the new master without a restart.  The sentinels' timing is short (down after 1 s,
failover timeout 3 s) so that a failover takes seconds.  Every file (the servers' RDBs of a full sync, the
sentinels' rewritten configurations, the logs) is in the run's directory, and everything is torn down at
the end of the run.

What the lossy failover does, and why in that order: the replica is frozen (SIGSTOP) and its link cut on
the master's side (`CLIENT KILL TYPE replica`: what was sent before is in the replica's socket and will be
read; nothing written after reaches it), the master takes `lag` seconds of writes from every component,
then it is killed (SIGKILL) and the replica thawed: the sentinels promote a replica that never received
those writes.  Freezing alone would lose nothing on loopback (the writes would wait in the replica's
socket buffer).  The old master comes back empty as a replica of the new one, as an orchestrator would
restart it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import redis

from ipamgc import childproc
from ipamgc.local_redis import redis_server_binary
from lab.chaos.redisproc import RedisProcess, free_port

log = logging.getLogger(__name__)

MASTER_NAME = "ipamgc"
DOWN_AFTER_MS = 1000  # a master unanswering this long is subjectively down
FAILOVER_TIMEOUT_MS = 3000  # a failover not done in this long is retried; the next one waits twice this
QUORUM = 2
# A sentinel whose timer stalls past 2 s (a loaded machine: this one has two cores and may run a benchmark
# beside, or a clock step) enters TILT and acts on nothing for 30 s by default; seen here, it made a
# forced failover take 40 s.  `SENTINEL DEBUG tilt-period` (Redis >= 7.0) shortens it (`SENTINEL_DEBUG`).
# After a forced failover the old master stays a writable master, its clients still connected, until a
# sentinel's INFO of it (every `info-period`, 10 s by default) shows it as one and four `publish-period`s
# (2 s by default) have passed since the switch; then it is told REPLICAOF and its clients are killed.
# Measured here with the defaults: the old master demoted 8-10 s after the switch.  Shortened to ~2 s.
SENTINEL_DEBUG = ("tilt-period", "2000", "info-period", "1000", "publish-period", "500")
READY_SECONDS = 30.0  # the sentinels know each other and the replica
FAILOVER_SECONDS = 30.0  # a failover's bound, from its start to the new master answering writes


def _probe(port: int) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=1.0, socket_connect_timeout=1.0)


class RedisHA:
    """Master, replica and three sentinels on loopback; `url` is the Sentinel URL every client takes.
    `master` is the server the sentinels name now (what `redis-restart`, `redis-rollback` and
    `redis-maxmemory` act on in such a run)."""

    def __init__(self, directory: Path, stop: threading.Event | None = None) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.stop_event = stop or threading.Event()
        self.binary = redis_server_binary()
        # `--dir`: a replica writes the RDB of its full sync (and a demoted master too) in its working
        # directory: the run's, never the checkout.
        base = ("--dir", str(self.dir))
        a, b = free_port(), free_port()
        self.servers = {
            a: RedisProcess(self.dir / f"redis-{a}.log", a, args=base),
            b: RedisProcess(self.dir / f"redis-{b}.log", b, args=(*base, "--replicaof", "127.0.0.1", str(a))),
        }
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.sentinels: list[subprocess.Popen[bytes]] = []
        self.failovers = 0
        # Held by each Redis fault while it acts (a failover, the maxmemory window): one at a time.
        self.exclusive = threading.Lock()

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{MASTER_NAME}/0"

    @property
    def port(self) -> int:
        return self.master_port()

    @property
    def master(self) -> RedisProcess:
        return self.servers[self.master_port()]

    def replica_port(self) -> int:
        return next(p for p in self.servers if p != self.master_port())

    def master_port(self) -> int:
        """The master's port as the sentinels name it (the first that answers)."""
        for port in self.sentinel_ports:
            with contextlib.suppress(redis.RedisError):
                addr = _probe(port).sentinel_get_master_addr_by_name(MASTER_NAME)
                if isinstance(addr, tuple):
                    return int(addr[1])
        raise RuntimeError("no sentinel names the master")

    def start(self) -> None:
        first, _ = self.servers
        for server in self.servers.values():
            server.start()
        for port in self.sentinel_ports:
            conf = self.dir / f"sentinel-{port}.conf"  # a sentinel rewrites its file: one each
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.dir}\n"
                f"sentinel monitor {MASTER_NAME} 127.0.0.1 {first} {QUORUM}\n"
                f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}\n"
            )
            with (self.dir / f"sentinel-{port}.log").open("ab") as out:
                self.sentinels.append(
                    childproc.popen(
                        [self.binary, str(conf), "--sentinel"],
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        cwd=self.dir,
                    )
                )
        for port in self.sentinel_ports:
            self._wait(functools.partial(self._tune, port), READY_SECONDS)
        if not self._wait(self._ready, READY_SECONDS):
            self.stop()
            raise RuntimeError(f"the sentinels did not see each other and the replica (logs in {self.dir})")

    def _tune(self, port: int) -> bool:
        """The timings of `SENTINEL_DEBUG`; True once the sentinel answered (an older one that does
        not know the command keeps its default)."""
        try:
            _probe(port).execute_command("SENTINEL", "DEBUG", *SENTINEL_DEBUG)  # type: ignore[no-untyped-call]
        except redis.ConnectionError:
            return False
        except redis.RedisError as exc:
            log.warning("sentinel %d: timings left as they are: %s", port, exc)
        return True

    def _ready(self) -> bool:
        for port in self.sentinel_ports:
            try:
                master = _probe(port).info("sentinel").get("master0", {})
            except redis.RedisError:
                return False
            if not (master.get("sentinels", 0) >= 3 and master.get("slaves", 0) >= 1):
                return False
        return True

    def _wait(self, predicate: Callable[[], object], timeout: float, interval: float = 0.05) -> bool:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline or self.stop_event.wait(interval):
                return False
        return True

    def _replica_caught_up(self) -> bool:
        """The sentinels count the replica as good: it answers and its link is up (else NOGOODSLAVE)."""
        try:
            info = _probe(self.replica_port()).info("replication")
        except redis.RedisError:
            return False
        return info.get("master_link_status") == "up"

    def failover(self) -> str:
        """`SENTINEL FAILOVER`: the replica promoted, the old master demoted to its replica (a write on it
        is refused: READONLY).  Sentinel's failover does not wait for the replica to catch up: writes in
        flight as it switches are lost too (the watcher's generation check sees them).  Returns what
        happened, for the timeline."""
        with self.exclusive:
            return self._failover()

    def _failover(self) -> str:
        old = self.master_port()
        started = time.monotonic()
        self._wait(self._replica_caught_up, FAILOVER_SECONDS)

        def asked() -> bool:  # NOGOODSLAVE until the sentinels have looked at the replica
            try:
                _probe(self.sentinel_ports[0]).sentinel_failover(MASTER_NAME)
            except redis.RedisError:
                return False
            return True

        if not self._wait(asked, FAILOVER_SECONDS, 0.2):
            return f"no failover: the sentinels refused it for {FAILOVER_SECONDS:.0f}s"
        promoted = self._wait(lambda: self._writable(old), FAILOVER_SECONDS)
        demoted = self._wait(lambda: self._role(old) == "slave", FAILOVER_SECONDS)
        self.failovers += 1
        return (
            f"master {old} → {self.master_port() if promoted else '?'} in {time.monotonic() - started:.1f}s; "
            f"old master {'demoted, ' + self._refuses(old) if demoted else 'NOT demoted'}"
        )

    def lossy_failover(self, lag: float) -> str:
        """The replica cut off for `lag` seconds of writes, then the master killed: the sentinels promote a
        replica without them (see the module docstring)."""
        with self.exclusive:
            return self._lossy_failover(lag)

    def _lossy_failover(self, lag: float) -> str:
        old, replica = self.master_port(), self.replica_port()
        self._wait(self._replica_caught_up, FAILOVER_SECONDS)
        proc = self.servers[replica].proc
        rpid = proc.pid if proc is not None else None
        if rpid is None:
            return "no failover: the replica is not running"
        os.kill(rpid, signal.SIGSTOP)
        try:
            with contextlib.suppress(redis.RedisError):
                _probe(old).client_kill_filter(_type="replica")
            before = self._offset(old)
            self.stop_event.wait(lag)
            after = self._offset(old)
            self.servers[old].kill()
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(rpid, signal.SIGCONT)
        started = time.monotonic()
        promoted = self._wait(lambda: self._writable(old), FAILOVER_SECONDS)
        took = time.monotonic() - started
        # The old master back, empty, as the new master's replica (an orchestrator restarts it).
        server = self.servers[old]
        server.args = (*server.args[:2], "--replicaof", "127.0.0.1", str(replica))
        server.start()
        self.failovers += 1
        return (
            f"replica {replica} cut off, master {old} took {lag}s of writes ({after - before} bytes of "
            f"replication stream) and was killed; {replica} "
            f"{'promoted' if promoted else 'NOT promoted'} {took:.1f}s later without them; {old} back "
            "empty as its replica"
        )

    def _offset(self, port: int) -> int:
        try:
            return int(_probe(port).info("replication").get("master_repl_offset", 0))
        except redis.RedisError:
            return 0

    def _role(self, port: int) -> str:
        try:
            return str(_probe(port).info("replication").get("role", ""))
        except redis.RedisError:
            return ""

    def _writable(self, old: int) -> bool:
        """The sentinels name a master other than `old`, and it takes a write."""
        try:
            port = self.master_port()
            return port != old and bool(_probe(port).set("chaos:failover-probe", "1", ex=60))
        except (redis.RedisError, RuntimeError):
            return False

    def _refuses(self, port: int) -> str:
        """What a writer still connected to the old master gets (the leader's fencing relies on it)."""
        try:
            _probe(port).set("chaos:stale-write-probe", "1")
        except redis.ReadOnlyError:
            return "a write on it is refused (READONLY)"
        except redis.RedisError as exc:
            return f"a write on it fails ({exc})"
        return "a write on it was ACCEPTED"

    # -- what a plain run's RedisProcess does: on the current master, after any failover under way --------

    def _master_answers(self) -> bool:
        try:
            return self._role(self.master_port()) == "master"
        except RuntimeError:
            return False

    def snapshot(self) -> dict[bytes, tuple[bytes, int]]:
        with self.exclusive:
            self._wait(self._master_answers, FAILOVER_SECONDS)
            return self.master.snapshot()

    def rollback(self, snapshot: dict[bytes, tuple[bytes, int]]) -> int:
        with self.exclusive:
            self._wait(self._master_answers, FAILOVER_SECONDS)
            return self.master.rollback(snapshot)  # replicated: the replica goes back too

    def restart_empty(self, down: float = 0.0, stop: threading.Event | None = None) -> None:
        with self.exclusive:
            self._wait(self._master_answers, FAILOVER_SECONDS)
            master = self.master
            master.args = master.args[:2]  # a master again (a promoted replica was started as one)
            master.restart_empty(down, stop)

    def stop(self) -> None:
        for proc in self.sentinels:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.sentinels:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        for server in self.servers.values():
            server.stop()
