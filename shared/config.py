"""Settings of every ipamgc process: one frozen dataclass, defaults that say why they are what they are.

Flags win over `IPAMGC_*` environment variables, which win over the defaults below: the entry points call
`from_env()` and then `dataclasses.replace` the fields whose flags were given.  Durations are seconds
(floats) in the dataclass; in the environment they are Go durations (`15m`, `90s`) or plain seconds.
Pure settings only: the Redis clients these settings name are built in `redisio.client`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from shared.calicogroup import CalicoGroup, parse_group
from shared.duration import parse_duration
from shared.errors import ConfigError
from shared.keys import QUEUED_TTL_SECONDS, Keys
from shared.shard import DEFAULT_SHARDS

ENV_PREFIX = "IPAMGC_"
# Calico's default `leakGracePeriod` (the KubeControllersConfiguration kube-controllers creates).
CALICO_DEFAULT_LEAK_GRACE_SECONDS = 900.0
# Calico's periodic full scan when the grace period is unset or zero.
FALLBACK_RESYNC_SECONDS = 300.0
BACKSTOPS = ("sweep", "full")  # `Settings.backstop`


@dataclass(frozen=True, slots=True)
class GraceOverride:
    """A `--leak-grace-period` given on the command line: it wins over the cluster's configuration."""

    seconds: float | None  # None: Calico's unset (never collect on live nodes)


@dataclass(frozen=True, slots=True)
class Settings:
    # -- Redis -----------------------------------------------------------------------------------------
    # A local Redis is what `ipamgc up` and the compose file run; a deployment always sets REDIS_URL.
    redis_url: str = "redis://127.0.0.1:6379/0"
    # Several deployments may share one Redis under different prefixes (shared/keys.py).
    key_prefix: str = "ipamgc"
    # Shards (units of parallel validation); see shared/shard.py.  Changing it needs an empty Redis.
    shards: int = DEFAULT_SHARDS

    # -- leak grace period -------------------------------------------------------------------------------
    # None: follow KubeControllersConfiguration/default (spec.controllers.node.leakGracePeriod).
    leak_grace_override: GraceOverride | None = None
    # Seconds; used when the cluster has no KubeControllersConfiguration `default` (Calico creates one
    # with 15m, so a cluster without it behaves as Calico's default).
    default_leak_grace_seconds: float = CALICO_DEFAULT_LEAK_GRACE_SECONDS

    # -- watcher timing ----------------------------------------------------------------------------------
    # Seconds between passes of the backstop of a level-triggered system.  None: Calico's period, leak
    # grace period / 2, or 5 minutes when the grace is unset or 0.
    resync_period_seconds: float | None = None
    # What a pass does (`producer/backstop.py`): "sweep", the audit of the mirror against the watcher's
    # memory and every allocation the memory cannot show valid re-validated; "full", every allocation
    # re-validated (the full resync, as Calico's full scan; what ran until 2026-12-04).
    backstop: str = "sweep"
    # Allocation ids marked dirty per Redis round trip during a resync (one HSCAN + SADD script call):
    # small enough that a call blocks Redis for a few milliseconds only.
    resync_chunk: int = 5000
    # Seconds of pause between resync chunks: spreads a 150,000-allocation resync over ~0.3 s instead of
    # one burst, so event publishing and the workers' reads interleave with it.
    resync_pause_seconds: float = 0.01
    # Benchmark baseline only (`ipamgc bench --mode full-scan`): after every batch of events it
    # publishes, the watcher marks every allocation dirty, so each sync re-validates the whole cluster as
    # Calico 3.26 did (#7841).  Never useful in production: it is the cost this project exists to avoid.
    full_scan: bool = False
    # Benchmark baseline only (`ipamgc bench --mode per-node`): Calico 3.30–3.33's algorithm (#9654, spec
    # §5).  The watcher marks dirty every allocation of every node an event touched (an allocation of it
    # appeared or vanished, a pod of it was deleted) and walks every block after each batch; a node
    # deletion is a full scan; workers do not promote due candidates (a candidate on a clean node waits
    # for the periodic full scan).  Never useful in production.
    per_node: bool = False
    # The longest between two `kick`s, seconds.  A kick runs when a candidate's grace period ends or a
    # worker's lease counts as dead (the due times workers and the leader offer on `P:wakeups`,
    # `producer/wakeups.py`), so this bounds only what nothing announces: a job armed but never run, a
    # Redis that lost the mirror, a wakeup lost with Redis.  Each idle kick is one round trip.
    kick_interval_seconds: float = 30.0
    # Events per mirror batch, and allocation ids per worker batch (Calico's BatchUpdateSize).
    batch_size: int = 1000
    # Seconds the watcher waits after a first event for more to merge into one batch (Calico's
    # batchWaitDuration).  Each batch arms a shard job (~59 Redis commands of RQ overhead) on every shard
    # it touched, so merging matters: measured at 100 pod operations/s on 100 nodes, 1 s instead of
    # 0.1 s cuts worker CPU per operation from 4.0 to 0.9 ms and Redis commands from 86 to 28, for at
    # most 1 s more latency (nothing next to a 15-minute grace period).
    batch_wait_seconds: float = 1.0
    # Parsed events waiting to be mirrored; when full, the watch threads block (back-pressure, as
    # Calico's channels of capacity 1000).  A pending list page counts its objects, an IPAMBlock as
    # `producer.handoff.BLOCK_WEIGHT` (8).
    queue_size: int = 10_000
    # Seconds a shard's "job queued" flag lives (shared/keys.py QUEUED_TTL_SECONDS): bounds how long a
    # shard whose job was lost (worker killed) waits for a new one.
    queued_ttl_seconds: float = QUEUED_TTL_SECONDS

    # -- Kubernetes API ----------------------------------------------------------------------------------
    # None: in-cluster configuration when running in a pod, else $KUBECONFIG or ~/.kube/config.
    kubeconfig: str | None = None
    kube_context: str | None = None
    # The API group of Calico's objects.  None: as Calico chooses (`shared.calicogroup.choose`, from the
    # server's `/apis`): projectcalico.org/v3 when served without crd.projectcalico.org, else v1.  Set it
    # as kube-controllers' CALICO_API_GROUP is set, if it is.
    calico_api_group: CalicoGroup | None = None
    # Objects per list page: Kubernetes' recommended chunk size; bounds the memory of one page.
    page_size: int = 500
    # Server-side watch timeout (timeoutSeconds), seconds; randomised up to 2× per watch, as client-go
    # does, so that reconnections of many watchers spread out.
    watch_timeout_seconds: int = 300
    # A watch's read timeout is its server-side timeout plus this many seconds: a connection silent for
    # longer is dead (half-open TCP) and is replaced.
    watch_read_margin_seconds: float = 30.0
    connect_timeout_seconds: float = 10.0
    # Read timeout of one list page, seconds (a 500-pod page is well under a second on a healthy server).
    list_timeout_seconds: float = 60.0
    # Back-off after API errors, full jitter: uniform(0, min(max, base · 2^attempt)) seconds; client-go's
    # reflector uses 800 ms initial and a 30 s cap.
    backoff_base_seconds: float = 0.8
    backoff_max_seconds: float = 30.0
    # Seconds between the watcher's looks at whether the API server serves kubevirt.io/v1 (one small
    # discovery GET): Calico polls every 30 s until KubeVirt is installed.  ipamgc keeps looking after, so
    # an uninstalled KubeVirt turns the VM rule off again (VM allocations kept, `kubevirt-absent`).
    kubevirt_discovery_seconds: float = 30.0

    # -- watcher election (a Kubernetes Lease, coordination.k8s.io/v1) ------------------------------------
    # Off only for single-replica local runs: two active watchers would publish twice (harmless, but
    # double cost) and relist over each other.
    election: bool = True
    # Where calico-kube-controllers runs; the Lease lives beside it.
    election_namespace: str = "kube-system"
    election_name: str = "ipamgc-watcher"
    # None: hostname-pid-random, unique per process.
    election_identity: str | None = None
    # Chosen for the idle floor, not client-go's 15 s / 10 s / 2 s: those renew every 2 s in each elected
    # process (an API write and its decode; with the 1 s kick, the largest share of an idle watcher's and
    # leader's py-spy samples after the kick and the idle reads), for a failover in ~15 s that a
    # leak collector does not need (a collector outage hurts only after hours).  Here: renewed every 15 s;
    # a standby takes over within lease + retry = 75 s of a crash (measured: docs/benchmarks.md, "Cost by
    # event rate") and within one retry, 15 s, of a graceful stop (the lease is released).  Whole seconds:
    # the Lease stores leaseDurationSeconds as an integer.
    election_lease_seconds: int = 60
    election_renew_seconds: float = 40.0
    election_retry_seconds: float = 15.0

    # -- workers -----------------------------------------------------------------------------------------
    # Seconds a worker may hold a batch unacked before the reaper hands it to another job: long enough
    # for 1,000 validations on a slow Redis, short enough that a killed worker's batch is redone soon.
    work_lease_seconds: float = 60.0
    # Seconds a shard job works before re-enqueueing itself, so one busy shard cannot starve the others
    # (a draining job: `--burst`; a lingering job lives up to
    # workers.shards.job_tuning.JobTuning.linger_budget).
    job_budget_seconds: float = 5.0
    # Seconds a lingering shard job (workers/shards/linger.py) stays with nothing to do before it ends: an
    # idle cluster then runs no job at all, and the next event's batch enqueues a new one.
    job_idle_seconds: float = 10.0

    def __post_init__(self) -> None:
        try:
            Keys(self.key_prefix)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        _at_least("shards", self.shards, 1)
        _at_least("resync_chunk", self.resync_chunk, 1)
        if self.backstop not in BACKSTOPS:
            raise ConfigError(f"backstop must be one of {', '.join(BACKSTOPS)}, got {self.backstop!r}")
        _at_least("batch_size", self.batch_size, 1)
        _at_least("queue_size", self.queue_size, 1)
        _at_least("page_size", self.page_size, 1)
        _at_least("watch_timeout_seconds", self.watch_timeout_seconds, 1)
        for name in (
            "kick_interval_seconds",
            "queued_ttl_seconds",
            "connect_timeout_seconds",
            "list_timeout_seconds",
            "backoff_base_seconds",
            "backoff_max_seconds",
            "kubevirt_discovery_seconds",
            "work_lease_seconds",
            "job_budget_seconds",
            "job_idle_seconds",
        ):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)!r}")
        for name in ("default_leak_grace_seconds", "resync_pause_seconds", "batch_wait_seconds"):
            if not getattr(self, name) >= 0:
                raise ConfigError(f"{name} must not be negative, got {getattr(self, name)!r}")
        if self.resync_period_seconds is not None and not self.resync_period_seconds > 0:
            raise ConfigError(f"resync period must be positive, got {self.resync_period_seconds!r}")
        grace = self.leak_grace_override
        if grace is not None and grace.seconds is not None and not grace.seconds >= 0:
            raise ConfigError(f"leak grace period must not be negative, got {grace.seconds!r}")
        # The rules kubernetes.leaderelection enforces (with sys.exit), checked here as a ConfigError.
        if (
            self.election_retry_seconds < 1
            or self.election_renew_seconds < 1
            or self.election_lease_seconds < 1
        ):
            raise ConfigError("election lease, renew deadline and retry period must each be at least 1 s")
        if not self.election_lease_seconds > self.election_renew_seconds > 1.2 * self.election_retry_seconds:
            raise ConfigError("election timing must satisfy lease > renew deadline > 1.2 × retry period")

    @property
    def keys(self) -> Keys:
        return Keys(self.key_prefix)

    def resync_period(self, grace: float | None) -> float:
        """The full-resync period for an effective grace period (seconds; None = unset)."""
        if self.resync_period_seconds is not None:
            return self.resync_period_seconds
        if grace is not None and grace > 0:
            return grace / 2
        return FALLBACK_RESYNC_SECONDS

    def with_overrides(self, **values: Any) -> Settings:
        """A copy with the given fields replaced; `None` values are ignored (a flag not given)."""
        given = {k: v for k, v in values.items() if v is not None}
        known = {f.name for f in fields(self)}
        unknown = sorted(set(given) - known)
        if unknown:
            raise ConfigError(f"unknown settings {unknown}")
        try:
            return replace(self, **given)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc


def _at_least(name: str, value: int, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{name} must be an integer of at least {low}, got {value!r}")


# -- parsing text (environment variables and flags) ---------------------------------------------------


def parse_seconds(text: str) -> float:
    """A Go duration (`15m`, `1m30s`, `500ms`) or plain seconds (`90`, `0.5`)."""
    try:
        return float(text)
    except ValueError:
        return parse_duration(text)


def parse_grace(text: str) -> GraceOverride:
    """`--leak-grace-period`: a duration, or `none` for Calico's unset (no collection on live nodes)."""
    if text.strip().lower() in ("none", "unset"):
        return GraceOverride(None)
    return GraceOverride(parse_seconds(text))


def parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"expected a boolean, got {text!r}")


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"expected an integer, got {text!r}") from None


# field → (environment variables, first set wins; parser)
_ENV: dict[str, tuple[tuple[str, ...], Callable[[str], Any]]] = {
    "redis_url": (("IPAMGC_REDIS_URL", "REDIS_URL"), str),
    "key_prefix": (("IPAMGC_PREFIX",), str),
    "shards": (("IPAMGC_SHARDS",), _int),
    "leak_grace_override": (("IPAMGC_LEAK_GRACE_PERIOD",), parse_grace),
    "default_leak_grace_seconds": (("IPAMGC_DEFAULT_LEAK_GRACE_PERIOD",), parse_seconds),
    "resync_period_seconds": (("IPAMGC_RESYNC_PERIOD",), parse_seconds),
    "resync_chunk": (("IPAMGC_RESYNC_CHUNK",), _int),
    "backstop": (("IPAMGC_BACKSTOP",), str),
    "resync_pause_seconds": (("IPAMGC_RESYNC_PAUSE",), parse_seconds),
    "full_scan": (("IPAMGC_FULL_SCAN",), parse_bool),
    "per_node": (("IPAMGC_PER_NODE",), parse_bool),
    "kick_interval_seconds": (("IPAMGC_KICK_INTERVAL",), parse_seconds),
    "batch_size": (("IPAMGC_BATCH_SIZE",), _int),
    "batch_wait_seconds": (("IPAMGC_BATCH_WAIT",), parse_seconds),
    "queue_size": (("IPAMGC_QUEUE_SIZE",), _int),
    "queued_ttl_seconds": (("IPAMGC_QUEUED_TTL",), parse_seconds),
    "kubeconfig": (("IPAMGC_KUBECONFIG",), str),
    "kube_context": (("IPAMGC_KUBE_CONTEXT",), str),
    "calico_api_group": (("IPAMGC_CALICO_API_GROUP", "CALICO_API_GROUP"), parse_group),
    "page_size": (("IPAMGC_PAGE_SIZE",), _int),
    "watch_timeout_seconds": (("IPAMGC_WATCH_TIMEOUT",), lambda t: int(parse_seconds(t))),
    "backoff_base_seconds": (("IPAMGC_BACKOFF_BASE",), parse_seconds),
    "backoff_max_seconds": (("IPAMGC_BACKOFF_MAX",), parse_seconds),
    "kubevirt_discovery_seconds": (("IPAMGC_KUBEVIRT_DISCOVERY_INTERVAL",), parse_seconds),
    "election": (("IPAMGC_ELECTION",), parse_bool),
    "election_namespace": (("IPAMGC_ELECTION_NAMESPACE", "POD_NAMESPACE"), str),
    "election_name": (("IPAMGC_ELECTION_NAME",), str),
    "election_identity": (("IPAMGC_ELECTION_IDENTITY", "POD_NAME"), str),
    "election_lease_seconds": (("IPAMGC_ELECTION_LEASE",), lambda t: int(parse_seconds(t))),
    "election_renew_seconds": (("IPAMGC_ELECTION_RENEW",), parse_seconds),
    "election_retry_seconds": (("IPAMGC_ELECTION_RETRY",), parse_seconds),
    "work_lease_seconds": (("IPAMGC_WORK_LEASE",), parse_seconds),
    "job_budget_seconds": (("IPAMGC_JOB_BUDGET",), parse_seconds),
    "job_idle_seconds": (("IPAMGC_JOB_IDLE",), parse_seconds),
}


def from_env(environ: Mapping[str, str] | None = None) -> Settings:
    """Settings from `IPAMGC_*` (and `REDIS_URL`, `CALICO_API_GROUP`, `POD_NAMESPACE`, `POD_NAME`);
    defaults elsewhere."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for name, (names, parse) in _ENV.items():
        for var in names:
            text = env.get(var)
            if text is None or text == "":
                continue
            try:
                values[name] = parse(text)
            except (ConfigError, ValueError) as exc:
                raise ConfigError(f"{var}={text!r}: {exc}") from exc
            break
    return Settings().with_overrides(**values)


def env_calico_group(environ: Mapping[str, str] | None = None) -> CalicoGroup | None:
    """`calico_api_group` from the environment alone (for the one-shot commands that take no other
    setting from it: `check`, `release`); None when unset."""
    env = os.environ if environ is None else environ
    names, parse = _ENV["calico_api_group"]
    for var in names:
        text = env.get(var)
        if text:
            try:
                value: CalicoGroup = parse(text)
            except ConfigError as exc:
                raise ConfigError(f"{var}={text!r}: {exc}") from exc
            return value
    return None
