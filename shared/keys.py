"""Every Redis key ipamgc uses, in one place.

Redis is a cache and a work queue, never the source of truth: everything below can be rebuilt by a relist
(timers restart, which only ever delays a release).  `P` is the prefix (`ipamgc`), `{s}` a shard number
in a Redis Cluster hash tag, so that every multi-key Lua script touches keys of one slot.  Shard =
`shared.shard.shard_of(node attribute)`.  Allocation id = `<handle>/<ip>` (Calico's key).  Records are
msgpack lists whose first element is a version tag (`shared/records.py`).

Per shard (hash tag `{s}`); W = writers, R = readers:

`P:alloc:{s}` HASH alloc id → allocation record (block, ordinal, sequence number, GC attributes).
    W mirror; R worker.  While the allocation is in a mirrored block.  Allocations without a `node`
    attribute have no record (Calico never collects them): they live in the handle index only.
`P:nodeallocs:{s}:<node>` SET of the alloc ids whose `node` attribute is `<node>`.
    W mirror; R worker (a gone node: all of it), mirror (node add/delete).  Gone when empty.
`P:nodeblocks:{s}:<node>` SET of the CIDRs of blocks with affinity `host:<node>`.  W mirror; R the
    empty-block pass (the watcher keeps its own copy in memory).  Gone when empty.
`P:dirtyblocks:{s}` SET of CIDRs whose host node was deleted.  W mirror; R the empty-block pass (leader).
`P:dirty:{s}` SET of alloc ids an event may have changed; repeats collapse.
    W mirror, worker (reaper, due promotion); R worker (SPOP).  Until taken.
`P:revalidate:{s}` STRING `<pass>:<cursor>`: a pass over every allocation of the shard is pending (an HSCAN
    cursor over `alloc:{s}`).  Set, before `synced`, by a watcher that started on a Redis not marked
    synced instead of dirtying what its first list found; workers move it into `dirty` a batch at a time
    (`ShardQueue.refill`).  W watcher, worker (only over the value read; DEL at the end); R `kick`, status.
`P:inflight:{s}` ZSET alloc id → lease deadline (epoch s; the deadline is also the lease token).
    W worker (take); R worker (ack, reaper), `kick`.  Until acked, or reaped back into dirty.
`P:queued:{s}` STRING `1`: a shard job is pending or running; `j:<RQ job id>`: held by that lingering
    job (workers/shards/linger.py), which serves the shard (its own, or adopted) until it ends.
    W mirror, `kick`, worker finish (SET NX PX, value `1`; the watcher never reads the value); a
    lingering job (SET its token PX one work lease, renewed well within it; only over an absent flag,
    its own, or `1` armed for a job still waiting: PTTL above one lease); DEL by the job's finish, or
    by a lingering job's release only while the value is its token.  TTL `QUEUED_TTL_SECONDS`, so a
    lost job cannot stall its shard; a running job keeps it at most one work lease ahead (PEXPIRE at
    each batch; a token's PX), and `kick` re-arms a flag no job has held for `KICK_UNSTARTED_SECONDS`
    (its armer died).  A job started for a shard holding another job's token exits at once.
`P:cand:{s}` HASH alloc id → candidate record (first seen invalid, sequence number seen with).
    W worker; R worker.  Cleared on a valid verdict, on vanish, on a changed sequence number (#12839).
`P:due:{s}` ZSET alloc id → time its grace period ends (+ a small epsilon).
    W worker, leader (a final re-check the API could not answer: due again in a few seconds, its `cand`
    and `decided` entries cleared); R worker (promotion into dirty), `kick`.  Removed when promoted or
    cleared.
`P:decided:{s}` HASH alloc id → decided record (sequence number decided, emitted at).
    W worker; R worker (dedup).  Cleared like `cand`; re-emitted after `REDECIDE_AFTER_SECONDS`.

Global (no hash tag; single-key commands only):

`P:blocks` HASH block CIDR → block record (resourceVersion, uid, host, in-use count,
    ordinal → (handle, sequence number, GC attributes)).  W mirror; R worker (resourceVersion for
    decisions), the leader's backstop scan, and the watcher only when it starts (or after a write failed
    half-way): it diffs against its own memory (`producer/memory.py`).  While the block exists.
`P:pods` HASH `<ns>/<name>` → slim pod record.  W mirror; R worker, the watcher when it starts.  While
    the pod exists.
`P:vms` HASH `<ns>/<name>` → slim VirtualMachine record (kubevirt.io/v1: it exists; its uid), and
`P:vmis` HASH `<ns>/<name>` → slim VirtualMachineInstance record (its uid, whether an ownerReference of
    kind VirtualMachine points at it), `shared/kubevirt.py`.  W mirror; R worker (the VM rule, only once
    `state.kubevirt` is `1`), the watcher when it starts.  While the object exists; empty (deleted) when
    KubeVirt is not installed.
`P:nodes` HASH node name → node record (uid, flannel-migration label).  W mirror; R worker (existence),
    mirror.  While the node exists.
`P:handles` ZSET, every member at score 0: one member per allocation, cluster-wide, the msgpack strings
    (sanitised handle, `handle_field(alloc id)`, its `node` attribute, `""`: none, never released)
    concatenated (`shared.records.encode_handle_member`), so that ZRANGE BYLEX over a handle's prefix
    (`handle_member_range`) lists its allocations.  The field is the IP, or the whole alloc id when the
    raw handle differs from the sanitised one (`alloc_id_of(handle, field)` inverts it).  W mirror (a batch:
    one ZADD, one ZREM); R leader (all-or-none).  Replaced `P:handle:<handle>` (docs/upgrading.md).
`P:cluster` HASH `server` (the API server URL the watcher reads), `kube_system_uid` (the uid of the
    namespace `kube-system`; empty when the watcher may not read it), `at` (epoch s): the cluster this
    Redis collects (`shared/cluster.py`).  W watcher, each time it starts publishing; R leader (stamped
    into its audit records), `ipamgc release` (refuses to write records of another cluster here), `ipamgc
    status`.  Permanent (rewritten by the next watcher).
`P:decisions` STREAM of release decisions (fields `id`, `d` = decision record).  W worker; R leader.
    Trimmed to about `DECISIONS_MAXLEN` entries.
`P:pulses` STREAM, an entry (`b` = `1`) the watcher appends in the pipeline of every batch that armed a
    shard, trimmed to `PULSES_MAXLEN`.  W mirror; R the long-lived shard jobs, which block on this one
    key (XREAD BLOCK) while idle instead of watching every shard's sets (an entry: look at the shards
    again).  Permanent.  Replaced `P:pulse` (a counter every job polled with a GET three times a second),
    which a watcher migrating an older layout deletes.
`P:wakeups` ZSET, a due time (epoch s) as both member and score: the earliest `due:{s}` entry written since
    the watcher last looked, so that its kick runs when a grace period ends instead of on a poll.  W the
    workers and the leader (ZADD then ZREMRANGEBYRANK 1 -1: only the earliest is kept; a hint, not the
    truth, which stays in `due:{s}`); W the watcher (BZPOPMIN, `producer/wakeups.py`).  Permanent, at
    most one member.
`P:empty` HASH block CIDR → empty-block record (host node, since when; `shared.records.EmptyBlock`),
    for every `host:`-affine block whose in-use count is 0 in the watcher's diff (Calico's
    `emptyBlocks`).  W mirror (an entry added when the count falls to 0 or the block is first seen
    empty, removed when it rises or the block goes; a block used and emptied again gets a new `since`);
    R the leader's empty-block pass, which reads only these blocks instead of every block record
    (every 5 s; a backstop scan of `P:blocks` every 5 min finds empty blocks missing here).  Bounded
    by the block count.
`P:coldblocks` HASH block CIDR → the earliest `releasedAt` (epoch s, text) of its ordinals in IP
    cooldown (Calico 3.33 `ipCooldownSeconds`: released, handle-less, not yet back in `unallocated`),
    Calico's `coldBlocks`.  W mirror (from its diff: set when a block starts cooling or its earliest
    changes, removed when none cools or the block goes); R the leader's cold-IP backstop, which visits
    only these blocks.  Bounded by the block count; empty on clusters without a cooldown.
`P:state` HASH: `leak_grace_period` (seconds; absent = unset), `leak_grace_since` (epoch s on the
    workers' clock, Redis `TIME`: when the watcher saw the grace period change; every leak timer started
    before it, candidate or empty block, counts from it, as Calico restarts with all its timers on a
    change of its configuration; absent = never changed), `datastore_ready` (`1`/`0`), `synced`
    (`1` once the initial list of every kind is mirrored), `listing` (`1` while the watcher lists, before
    `synced`: gone before `synced` is set means Redis lost the data meanwhile), `shards`,
    `last_full_resync` (epoch s), `kubevirt` (`1` once the watcher found kubevirt.io/v1 served and its
    first lists of VMs and VMIs are mirrored; absent while KubeVirt is not installed or not yet listed:
    the VM rule then keeps every VM allocation, `kubevirt-absent`), `ip_cooldown` (IPAMConfig
    `default`'s `ipCooldownSeconds`, an integer; `0` when there is no such object; absent until this
    watcher has listed IPAMConfigs: the leader then reads the live object, as it always does before it
    writes), `layout` (`LAYOUT`, the key layout the watcher writes; absent beside mirror data: an older
    layout, migrated when a watcher starts, `producer/layout.py`).
    W mirror; R worker, leader (grace period, cooldown), `ipamgc status`.  Permanent.

RQ owns `rq:*`; shard jobs go to the queue named `queue_name(s)` (`P-shard-<s>`).

The leader's keys (global; its fenced scripts read `P:leader:<lease>` together with the key they write,
so they need a single Redis, not a Cluster):

`P:leader:<lease>` HASH, the fencing record of the leader elected on the Lease `<lease>`: `epoch`
    (HINCRBY by each leader when it acquires the Lease), `token` (`<epoch>:<identity>`: every leader
    write to Redis runs in a Lua script that first checks the stored token equals its own, and every
    Kubernetes write is preceded by the same check), `identity`, `acquired_at`, `heartbeat` (epoch s).
    W leader; R leader, `ipamgc status`.  Permanent.  The `decisions` stream is read through the
    consumer group `leader` (`leader-dry-run` for a dry run), one consumer per leader identity; entries
    are acked once handled.
`P:emptyblocks` HASH block CIDR → `"<first> <since>"`: when the leader first saw the (`host:`,
    GC-)empty block (epoch s, text; the later of its clock and `since`), and the `P:empty` entry's
    `since` it saw then (absent for a block the backstop scan found missing from `P:empty`), Calico's
    `blockReleaseTracker`.  A different `since` restarts the timer (the block was used meanwhile).
    W leader (fenced); R leader.  Cleared when the block leaves `P:empty` (non-empty, gone) and on
    the block's release.
`P:audit` STREAM of the leader's outcomes, one entry per release or refusal (fields in
    `workers/leader/audit.py`).  W leader (appends are not fenced: a stale leader's refusals are recorded too,
    with their epoch); R `ipamgc audit`.  Trimmed to about `workers.leader.audit.AUDIT_MAXLEN` entries.

`P:handlegc` HASH, what the leader's handle collector saw at its last scan (`docs/handles.md`):
    `at` (epoch s), `enabled`, `dry_run` (`1`/`0`), `handles`, `blocks` (objects listed),
    `divergent|<class>` and `due|<class>` (handles now), `repaired|<class>` and `refused|<class>`
    (totals of this leader's term).  W leader (one HSET per scan); R `ipamgc status`.  Permanent,
    overwritten by each scan; absent until a leader has scanned.

Observability (global; `shared/metrics_names.py` names the fields):

`P:health:<component>:<instance>` STRING, one per process: JSON `{"pid", "state", "at", "started",
    "version"}` (`at`, `started`: epoch s), component `watcher`/`worker`/`leader`, instance
    `IPAMGC_INSTANCE`, else `POD_NAME`, else the hostname.  W the process itself every 5 s while its main
    loop makes progress (`SET … EX 30`), DEL on a clean stop; R `ipamgc health` (the liveness and
    readiness probes).  Gone 30 s after the process stopped beating: a missing key is a dead process.
`P:metrics` HASH of the counters that several worker processes add to (`batch_sum`, `batch_le|<i>`,
    `validated`, `decisions|<reason>`).  W workers (HINCRBY/HINCRBYFLOAT in the pipeline
    of each batch); R the active watcher, which exposes them.  Permanent (counters; a flush resets them,
    which Prometheus reads as a counter reset).
`P:reclaimed` HASH `<block CIDR>|<node>` → IPs released, Calico's `ipam_allocations_gc_reclamations`
    before the block is mapped to its pool.  W leader (HINCRBY once per pass); R, and HDEL of the nodes
    that are gone with nothing left in the mirror, the active watcher.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from shared.model import sanitize_handle

# A shard job that is lost (worker killed, Redis restarted under it) must not stall its shard forever:
# the `queued` flag expires after this long and the next event or `kick` enqueues a fresh job.  It is far
# longer than a job's time budget, so a live job is never duplicated by it in practice.
QUEUED_TTL_SECONDS = 300.0
# Decisions older than this are emitted again when the allocation is re-validated and still confirmed:
# a decision the leader lost (stream trimmed, leader crashed) is re-sent by the next resync.
REDECIDE_AFTER_SECONDS = 300.0
# Approximate cap of the decisions stream (XADD MAXLEN ~): bounds memory if no leader consumes it.
DECISIONS_MAXLEN = 100_000

# Fields of the `state` hash.
STATE_GRACE = "leak_grace_period"
STATE_GRACE_SINCE = "leak_grace_since"
STATE_DATASTORE_READY = "datastore_ready"
STATE_SYNCED = "synced"
STATE_LISTING = "listing"
STATE_SHARDS = "shards"
STATE_LAST_FULL_RESYNC = "last_full_resync"
# Incremented by every write pipeline of the watcher (`producer/generation.py`): a value lower than the
# one it last wrote means Redis lost its writes (a failover to a replica behind, an older AOF).
STATE_GENERATION = "generation"
STATE_KUBEVIRT = "kubevirt"
STATE_IP_COOLDOWN = "ip_cooldown"
STATE_LAYOUT = "layout"
# The key layout the watcher writes: 2 = the handle index in one ZSET (`P:handles`), the pulse a STREAM
# (`P:pulses`).  A Redis holding mirror data and no `layout` is of the older one (a HASH per handle, a
# pulse counter), which the watcher migrates.
LAYOUT = "2"
# Entries `P:pulses` keeps: a job needs to know that one arrived since it last looked, and which shards
# the batches named (a job that may have missed some, having read all 16, looks at every shard).
PULSES_MAXLEN = 16
# A pulse entry's field naming the shards its batch made work in, comma-separated (`pulse_fields`); a
# lingering job looks at those (and at due ones) instead of at every shard it holds.
PULSE_SHARDS = "s"


def pulse_fields(shards: Iterable[int]) -> dict[str, bytes]:
    """A pulse entry's fields (the watcher's, `producer.writes`): the shards its batch made work in."""
    return {"b": b"1", PULSE_SHARDS: ",".join(str(s) for s in shards).encode()}


@dataclass(frozen=True, slots=True)
class ShardKeys:
    """The keys of one shard, all in one Redis Cluster slot."""

    shard: int
    alloc: str
    dirty: str
    inflight: str
    queued: str
    cand: str
    due: str
    decided: str
    dirtyblocks: str
    revalidate: str


class Keys:
    """Key names under one prefix (several deployments can share a Redis with different prefixes)."""

    def __init__(self, prefix: str = "ipamgc") -> None:
        if not prefix or "{" in prefix or "}" in prefix:
            raise ValueError(f"bad key prefix {prefix!r}")
        self.prefix = prefix

    def _tagged(self, name: str, shard: int) -> str:
        if shard < 0:
            raise ValueError(f"bad shard {shard}")
        return f"{self.prefix}:{name}:{{{shard}}}"

    # -- per shard ------------------------------------------------------------------------------------

    def alloc(self, shard: int) -> str:
        return self._tagged("alloc", shard)

    def nodeallocs(self, shard: int, node: str) -> str:
        return f"{self._tagged('nodeallocs', shard)}:{node}"

    def nodeblocks(self, shard: int, node: str) -> str:
        return f"{self._tagged('nodeblocks', shard)}:{node}"

    def dirtyblocks(self, shard: int) -> str:
        return self._tagged("dirtyblocks", shard)

    def dirty(self, shard: int) -> str:
        return self._tagged("dirty", shard)

    def revalidate(self, shard: int) -> str:
        return self._tagged("revalidate", shard)

    def inflight(self, shard: int) -> str:
        return self._tagged("inflight", shard)

    def queued(self, shard: int) -> str:
        return self._tagged("queued", shard)

    def cand(self, shard: int) -> str:
        return self._tagged("cand", shard)

    def due(self, shard: int) -> str:
        return self._tagged("due", shard)

    def decided(self, shard: int) -> str:
        return self._tagged("decided", shard)

    def shard(self, shard: int) -> ShardKeys:
        return ShardKeys(
            shard=shard,
            alloc=self.alloc(shard),
            dirty=self.dirty(shard),
            inflight=self.inflight(shard),
            queued=self.queued(shard),
            cand=self.cand(shard),
            due=self.due(shard),
            decided=self.decided(shard),
            dirtyblocks=self.dirtyblocks(shard),
            revalidate=self.revalidate(shard),
        )

    # -- global ---------------------------------------------------------------------------------------

    @property
    def blocks(self) -> str:
        return f"{self.prefix}:blocks"

    @property
    def pods(self) -> str:
        return f"{self.prefix}:pods"

    @property
    def nodes(self) -> str:
        return f"{self.prefix}:nodes"

    @property
    def vms(self) -> str:
        """KubeVirt VirtualMachines, `<ns>/<name>` → `shared.kubevirt` VM record."""
        return f"{self.prefix}:vms"

    @property
    def vmis(self) -> str:
        """KubeVirt VirtualMachineInstances, `<ns>/<name>` → `shared.kubevirt` VMI record."""
        return f"{self.prefix}:vmis"

    @property
    def decisions(self) -> str:
        return f"{self.prefix}:decisions"

    @property
    def wakeups(self) -> str:
        """The earliest due time the watcher may not know of (see the docstring)."""
        return f"{self.prefix}:wakeups"

    @property
    def pulses(self) -> str:
        """Appended to by the watcher per batch that made work (see the docstring)."""
        return f"{self.prefix}:pulses"

    @property
    def old_pulse(self) -> str:
        """The older layout's pulse counter: only deleted now."""
        return f"{self.prefix}:pulse"

    @property
    def empty(self) -> str:
        """Host-affine blocks with no allocation, as the watcher diffed them: CIDR → `EmptyBlock`."""
        return f"{self.prefix}:empty"

    @property
    def coldblocks(self) -> str:
        """Blocks with IPs in cooldown, as the watcher diffed them: CIDR → earliest `releasedAt`."""
        return f"{self.prefix}:coldblocks"

    @property
    def state(self) -> str:
        return f"{self.prefix}:state"

    @property
    def audit(self) -> str:
        return f"{self.prefix}:audit"

    @property
    def cluster(self) -> str:
        """The identity of the cluster the watcher collects (`shared.cluster.ClusterIdentity`)."""
        return f"{self.prefix}:cluster"

    @property
    def emptyblocks(self) -> str:
        return f"{self.prefix}:emptyblocks"

    @property
    def metrics(self) -> str:
        """The counters several worker processes add to (`shared/metrics_names.py`)."""
        return f"{self.prefix}:metrics"

    @property
    def handle_gc(self) -> str:
        """The handle collector's last scan (see the docstring)."""
        return f"{self.prefix}:handlegc"

    @property
    def reclaimed(self) -> str:
        """IPs released per (block, node): `shared.metrics_names.reclaimed_field`."""
        return f"{self.prefix}:reclaimed"

    def health(self, component: str, instance: str) -> str:
        """The heartbeat of one process (see the docstring)."""
        return f"{self.prefix}:health:{component}:{instance}"

    def leader(self, lease: str) -> str:
        """The fencing record of the leader elected on the Lease named `lease`."""
        return f"{self.prefix}:leader:{lease}"

    @property
    def handles(self) -> str:
        """The handle index (see the docstring)."""
        return f"{self.prefix}:handles"

    def old_handle(self, handle: str) -> str:
        """The handle index of an older layout, one HASH per (sanitised) handle: only deleted now."""
        return f"{self.prefix}:handle:{handle}"

    def queue_name(self, shard: int) -> str:
        """The RQ queue of a shard's jobs."""
        return f"{self.prefix}-shard-{shard}"


def pod_key(namespace: str, name: str) -> str:
    """Field of the `pods` hash."""
    return f"{namespace}/{name}"


def handle_field(alloc_id: str) -> str:
    """An allocation's field in the handle index, beside its sanitised handle (see the docstring)."""
    handle, _, ip = alloc_id.rpartition("/")
    return ip if sanitize_handle(handle) == handle else alloc_id


def alloc_id_of(handle: str, field: str) -> str:
    """Inverse of `handle_field`, given the (sanitised) handle of the hash."""
    return field if "/" in field else f"{handle}/{field}"
