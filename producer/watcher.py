"""The watcher process: one elected replica lists and watches the cluster and publishes dirty allocations.

Threads (all stop on `stop()`, SIGTERM/SIGINT in the entry point, or the loss of the Lease):
- election (`producer/election.py`): standby replicas wait here; the leader renews the Lease;
- one reflector per watched kind (`producer/kube.py`): list, watch, relist after 410, back off; each
  hands typed items to one bounded queue (`producer/handoff.py`: back-pressure when the publisher falls
  behind);
- the publisher (the thread that called `run()`): takes items in batches (up to `batch_size`, waiting
  at most `batch_wait_seconds` after the first) and applies them (`producer/publisher.py`: each kind's
  events merged, the last state of an object wins, a relist is a barrier; the `Mirror` is the only writer
  of the mirror's indexes; configuration changes go through `Mirror.set_config`; the mirror is marked
  synced once the first list of every kind is in, nothing is decided before), and `kick`s when the next
  due time comes (candidates whose grace period ended, leases of dead workers), at least every
  `kick_interval_seconds` (`producer/wakeups.py`);
- the wakeups (`producer/wakeups.py`): a blocking read of the due times workers and the leader write;
- the resync (`producer/resync.py`): every leak grace period / 2 (else 5 minutes, or
  `resync_period_seconds`), the backstop (`producer/backstop.py`) is handed to the publisher thread,
  which runs it between batches: the mirror audited against its memory, every allocation the memory
  cannot show valid dirtied (`--backstop full`: every allocation dirtied, on this thread).

This module is the lifecycle that ties them together: the Lease, the threads, the retries on Redis, the
publish loop and its kick timer, and the exit status the supervisor acts on.  Shard jobs go to RQ with
msgpack (`redisio/shardqueue/jobs.py`, the same module the workers run them from).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator

import redis

from kubeio.client import ApiClient
from kubeio.cluster import read_identity
from kubeio.errors import KubeError
from kubeio.watch import Backoff
from producer.allocaudit import forget_blocks_missing_records
from producer.backstop import Backstop
from producer.election import LeaseElector
from producer.handoff import Handoff
from producer.kinds import WATCHED, Kind
from producer.kube import KubeApi, api_client
from producer.kubevirt import KubeVirtWatch
from producer.mirror import Mirror
from producer.publisher import MIRRORED, Publisher
from producer.reflector import Reflector, WatchStats
from producer.relist import Kind as MirrorKind
from producer.resync import Resync
from producer.threadname import name_this_thread
from producer.wakeups import KickSchedule, Wakeups
from redisio.client import redis_client
from redisio.shardqueue.jobs import ShardEnqueuer
from shared.clock import Clock
from shared.cluster import ClusterIdentity
from shared.config import Settings
from shared.keys import STATE_SYNCED

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_LOST_LEADERSHIP = 1  # the supervisor restarts the process, which comes back as a standby
EXIT_SOFTWARE = 70  # a watch or resync thread died of a bug (sysexits EX_SOFTWARE): restart
EXIT_MIRROR_LOST = 75  # Redis lost the mirror (restarted empty, flushed): restart to relist (EX_TEMPFAIL)


class Watcher:
    """See the module docstring.  `run()` blocks; `stop()` may be called from any thread."""

    def __init__(
        self,
        settings: Settings,
        api: ApiClient,
        client: redis.Redis,
        *,
        clock: Clock | None = None,
    ) -> None:
        self.settings = settings
        self.keys = settings.keys
        self.stats = WatchStats()
        self.api_client = api
        # Monotonic time the standby wait or the publish loop last came round (the heartbeat's liveness).
        self.progress_at = time.monotonic()
        self.mirror = Mirror(
            client,
            self.keys,
            settings.shards,
            ShardEnqueuer(client, self.keys),
            clock=clock,
            queued_ttl=settings.queued_ttl_seconds,
            job_lease=settings.work_lease_seconds,
        )
        self.mirror.on_malformed_block = lambda: self.stats.add("malformed", Kind.BLOCKS)
        self.api = KubeApi(
            api,
            calico=settings.calico_api_group,
            page_size=settings.page_size,
            watch_timeout=settings.watch_timeout_seconds,
            read_margin=settings.watch_read_margin_seconds,
            connect_timeout=settings.connect_timeout_seconds,
            list_timeout=settings.list_timeout_seconds,
        )
        self._stop = threading.Event()
        # The hand-off from the watch threads to the publisher (`put` is every reflector's sink).
        self.handoff = Handoff(settings, self._stop)
        # When the publish loop kicks next: lowered by the wakeups thread, which then ends its wait.
        self.schedule = KickSchedule(settings.kick_interval_seconds, self.handoff.nudge, time.monotonic)
        self.mirror.arming.schedule = self.schedule
        self.mirror.arming.on_lost = self._lost  # any kick that finds the mirror gone (`ShardArming.kick`)
        self.wakeups = Wakeups(client, self.keys, self.schedule, self.mirror.clock.now, self._stop)
        self.kubevirt = KubeVirtWatch(
            api,
            self.api,
            self.handoff.put,
            self.stats,
            self._stop,
            lambda: Backoff(settings.backoff_base_seconds, settings.backoff_max_seconds),
            settings.kubevirt_discovery_seconds,
            self._guarded,
        )
        self._wake = threading.Event()  # leadership gained, or stop
        self.synced = threading.Event()
        self.resync = Resync(
            settings,
            self.mirror,
            self.stats,
            self._stop,
            self.synced,
            lambda: self.publisher.configured_grace,
            ask=self.handoff.nudge,
        )
        self.backstop = Backstop(self.mirror, self.stats, self._relist)
        self.mirror.generation.on_lost = self._writes_lost
        self._reflectors: dict[MirrorKind, Reflector] = {}
        self.publisher = Publisher(
            settings,
            self.mirror,
            self.stats,
            self._stop,
            self.synced,
            on_config_changed=self.resync.wake,
            on_lost=self._lost,
        )
        # The resource versions applied, per kind (the publisher updates this dict in place).
        self.applied_rv: dict[Kind, str] = self.publisher.applied_rv
        self._crashed = False
        self._mirror_lost = False
        self.elector: LeaseElector | None = None
        if settings.election:
            self.elector = LeaseElector(
                api,
                namespace=settings.election_namespace,
                name=settings.election_name,
                identity=settings.election_identity,
                lease_seconds=settings.election_lease_seconds,
                renew_seconds=settings.election_renew_seconds,
                retry_seconds=settings.election_retry_seconds,
                on_started=self._wake.set,
                on_lost=self.stop,
            )

    # -- control ---------------------------------------------------------------------------------------

    def stop(self) -> None:
        self._stop.set()
        self.handoff.nudge()  # the publish loop may wait for its next kick, up to `kick_interval_seconds`
        self._wake.set()
        self.resync.wake()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def leading(self) -> bool:
        return self.elector is None or self.elector.leading.is_set()

    @property
    def _paged(self) -> int:
        """List objects handed off and not yet taken (`Handoff.paged`; tests check it drains to 0)."""
        return self.handoff.paged

    def request_resync(self) -> None:
        """Run a backstop pass now (then the period restarts)."""
        self.resync.request()

    def _writes_lost(self, expected: int, found: int) -> None:
        """Redis lost writes of this watcher (`producer/generation.py`): the backstop repairs, now, and every
        kind is relisted (a memory reloaded from that Redis after a failed write lacks the lost writes
        too, so only the API can say what they were)."""
        self.stats.add("redis_lost_writes")
        self.backstop.after_loss = True
        self.resync.request()
        for reflector in self._reflectors.values():
            reflector.request_relist()

    def _relist(self, kind: MirrorKind) -> None:
        """The backstop's repair: relist `kind` (its reflector ends its watch and lists)."""
        reflector = self._reflectors.get(kind)
        if reflector is not None:
            reflector.request_relist()

    def run(self) -> int:
        """Wait for the Lease, then publish until stopped; returns the process exit status."""
        elector_thread = None
        if self.elector is not None:
            elector_thread = threading.Thread(target=self.elector.run, name="ipamgc-election", daemon=True)
            elector_thread.start()
            while not self._wake.wait(1.0):
                self.progress_at = time.monotonic()
        try:
            if self._stop.is_set():
                return self._exit_status()
            self._lead()
            return self._exit_status()
        finally:
            if self.elector is not None and elector_thread is not None:
                self.elector.stop.set()
                elector_thread.join(timeout=10)
                self.elector.release()

    def _exit_status(self) -> int:
        if self._mirror_lost:
            return EXIT_MIRROR_LOST
        if self._crashed:
            return EXIT_SOFTWARE
        if self.elector is not None and self.elector.lost.is_set():
            return EXIT_LOST_LEADERSHIP
        return EXIT_OK

    def _lead(self) -> None:
        log.info("publishing", extra={"prefix": self.keys.prefix, "shards": self.settings.shards})
        # Nothing is decided until this process has listed everything itself.  A Redis laid out for
        # another shard count raises ConfigError (exit 2); Redis being down is waited out.
        if not self._retrying_redis(self._start_mirror):
            return
        s = self.settings
        reflectors = [
            Reflector(
                self.api,
                kind,
                self.handoff.put,
                self.stats,
                self._stop,
                Backoff(s.backoff_base_seconds, s.backoff_max_seconds),
                paged=kind in MIRRORED,
            )
            for kind in WATCHED
        ]
        self._reflectors = {MIRRORED[r.kind]: r for r in reflectors if r.kind in MIRRORED}
        threads = [
            threading.Thread(target=self._guarded, args=(r.run,), name=f"ipamgc-watch-{r.kind}", daemon=True)
            for r in reflectors
        ]
        threads.append(
            threading.Thread(target=self._guarded, args=(self.resync.run,), name="ipamgc-resync", daemon=True)
        )
        threads.append(
            threading.Thread(
                target=self._guarded, args=(self.kubevirt.run,), name="ipamgc-kubevirt", daemon=True
            )
        )
        for t in threads:
            t.start()
        # Not joined at the end: it may be blocked in Redis for up to `wakeups.WAIT_SECONDS` (a daemon).
        threading.Thread(
            target=self._guarded, args=(self.wakeups.run,), name="ipamgc-wakeups", daemon=True
        ).start()
        try:
            self._publish_loop()
        finally:
            self.stop()
            for r in reflectors:
                r.interrupt()
            self.kubevirt.interrupt()
            for t in threads:
                t.join(timeout=10)
            log.info("stopped publishing", extra={"stats": self.stats.snapshot()})

    def _guarded(self, target: Callable[[], None]) -> None:
        """A thread that dies of a bug takes the watcher down (a half-watching mirror would go stale)."""
        name_this_thread()
        try:
            target()
        except Exception:  # the thread boundary: log it, stop, let the supervisor restart us
            log.exception("%s died; stopping", threading.current_thread().name)
            self._crashed = True
            self.stop()

    def _start_mirror(self) -> None:
        self.mirror.ensure_layout()
        if self.mirror.revalidate_when_synced():  # Redis is not marked synced
            self._forget_partial_blocks()
        self.mirror.migrate_layout()
        self.mirror.mark_synced(False)
        self.mirror.kubevirt.reset()  # the VM rule waits for this process's own lists of VMs and VMIs
        self.mirror.set_ip_cooldown(None)  # an earlier watcher's value: the leader reads live until ours
        self._record_cluster()

    def _forget_partial_blocks(self) -> None:
        """A Redis never marked synced since it was written may hold half a batch (`producer/allocaudit.py`):
        the blocks whose bases lack allocation records are written whole by the first list."""
        m = self.mirror
        missing = forget_blocks_missing_records(m.redis, self.keys, m.held_memory(), m.shards)
        if missing:
            self.stats.add("backstop_repairs", str(MirrorKind.BLOCKS), n=len(missing))
            log.warning(
                "Redis is not marked synced and %d blocks hold allocations without their records (e.g. %s): "
                "writing them whole",
                len(missing),
                min(missing),
            )

    def _record_cluster(self) -> None:
        """`P:cluster`: which cluster this Redis collects (`shared/cluster.py`), for the leader's audit
        records and `ipamgc release`'s refusal to write into another cluster's Redis."""
        try:
            identity = read_identity(self.api_client)
        except KubeError as exc:  # never a reason not to collect: the URL alone still names it
            log.warning("cluster identity: %s; recording the server URL only", exc)
            identity = ClusterIdentity(str(self.api_client.configuration.host).rstrip("/"))
        self.mirror.redis.hset(self.keys.cluster, mapping=identity.to_mapping(time.time()))

    # -- the publish loop --------------------------------------------------------------------------------

    def _retrying_redis(self, step: Callable[[], object]) -> bool:
        """Run `step` until it gets through Redis (back-off between tries); False if stopped first."""
        backoff = Backoff(self.settings.backoff_base_seconds, self.settings.backoff_max_seconds)
        while not self._stop.is_set():
            try:
                step()
                return True
            except redis.RedisError as exc:
                delay = backoff.next()
                self.stats.add("redis_errors")
                log.warning("Redis: %s; retrying in %.1fs", exc, delay, extra={"prefix": self.keys.prefix})
                self._stop.wait(delay)
        return False

    def _publish_loop(self) -> None:
        schedule = self.schedule
        while not self._stop.is_set():
            self.progress_at = time.monotonic()
            batch = self.handoff.take(schedule.left())
            # A batch that failed on Redis is applied again whole: every mirror write is idempotent.
            if batch and not self._retrying_redis(functools.partial(self.publisher.apply, batch)):
                return
            if self.resync.take() and not self._retrying_redis(self.backstop.run):
                return
            if not schedule.due():
                continue
            if not self.synced.is_set():
                schedule.kicking()  # nothing is armed before the sync (which kicks when it ends)
                schedule.kicked(None)
                continue
            # One round trip: the kick reads the `synced` marker with its scripts (as `_check_mirror`
            # of `producer/publisher.py` does before the mirror is synced).
            if not self._retrying_redis(self._kick) or self._mirror_lost:
                return
            self.stats.add("kicks")

    def _kick(self) -> None:
        self.mirror.kick(require=STATE_SYNCED)  # None: gone, `_lost` ran (it reschedules itself)

    def _lost(self) -> None:
        if self._mirror_lost:
            return
        log.error("the mirror is gone from Redis (restarted empty or flushed): exiting to relist")
        self._mirror_lost = True
        self.stop()


@contextlib.contextmanager
def open_watcher(settings: Settings, *, clock: Clock | None = None) -> Iterator[Watcher]:
    """A Watcher on clients built from `settings`, closed on exit."""
    api = api_client(settings.kubeconfig, settings.kube_context)
    try:
        client = redis_client(settings.redis_url)
        try:
            yield Watcher(settings, api, client, clock=clock)
        finally:
            client.close()
    finally:
        api.close()
