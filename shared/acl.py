"""Redis least privilege: one ACL user per component, limited to the keys and commands that component uses.

Why this exists: without it every ipamgc process (and `ipamgc status`) holds Redis's default user, which
can FLUSHALL, rewrite the mirror or forge release decisions.  With it, a compromised or buggy worker can
touch only its shard sets, its candidate timers and the decisions stream; the read-only user of
`status`/`audit` can write nothing at all.

The key patterns are built by calling `shared.keys.Keys` itself (a per-shard key with the shard tag made
a glob, a per-object key with its object made a glob), so they follow the prefix and any renamed key; the
W/R columns of the `Keys` docstring are the grants below.  RQ owns `rq:*` (the watcher enqueues, the
worker works and registers itself); the leader and the read-only user touch no RQ key except the reader's
read of the worker registry for `ipamgc status`.  The commands are the exact ones each component sends
(its own code, its Lua scripts, which Redis checks against the caller's user, and RQ's), found by running
each component under its user (tests/system/test_redis_acl.py fails on any refusal).

`acl_file` renders a Redis ACL file (`redis-server --aclfile`); `ipamgc redis-acl` prints it.  The
default user is left able to run PING only (the container probes' `redis-cli ping`), nothing else.
Pure: data in, text out.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from urllib.parse import parse_qs, unquote, urlsplit

from shared.keys import Keys

COMPONENTS = ("watcher", "worker", "leader", "reader")


class Access(StrEnum):
    READ = "%R~"
    WRITE = "~"  # read and write: Redis 7 checks both for read-modify-write commands (HINCRBY, SPOP)


@dataclass(frozen=True, slots=True)
class KeyGrant:
    pattern: str
    access: Access


@dataclass(frozen=True, slots=True)
class AclUser:
    name: str
    keys: tuple[KeyGrant, ...]
    commands: tuple[str, ...]  # lower-case; `client|setname` for a subcommand
    channels: tuple[str, ...] = ()


# Every client: PING (health checks), TIME (clock reads against Redis), MULTI/EXEC (redis-py pipelines
# are transactions by default), and redis-py's `register_script` (EVALSHA; SCRIPT EXISTS/LOAD on a
# pipeline or a NOSCRIPT).  Redis checks every command a script runs against the caller's user too.
_CONNECTION = ("ping", "select", "time", "multi", "exec", "discard")
_SCRIPTS = ("evalsha", "script|load", "script|exists")

# RQ 3's commands: its enqueue (watcher) and its SimpleWorker (worker): registration, dequeue (BLPOP),
# job hashes, registries (sorted sets), results (streams), the worker's command channel, and its Lua
# scripts.  Not granted: what ipamgc never asks of RQ (queue compaction's RENAME, cron, CLIENT KILL).
_RQ = (
    "hset",
    "hget",
    "hgetall",
    "hmget",
    "hexists",
    "hdel",
    "hincrby",
    "hincrbyfloat",
    "hsetnx",
    "rpush",
    "lpush",
    "lpop",
    "lrem",
    "lrange",
    "llen",
    "lpos",
    "lmove",
    "blmove",
    "blpop",
    "sadd",
    "srem",
    "smembers",
    "sunion",
    "scard",
    "zadd",
    "zrem",
    "zrange",
    "zrangebyscore",
    "zremrangebyscore",
    "zscore",
    "zcard",
    "zcount",
    "zpopmin",
    "expire",
    "persist",
    "del",
    "exists",
    "set",
    "get",
    "watch",
    "unwatch",
    "info",
    "xadd",
    "xrevrange",
    "xread",
    "xlen",
)
_RQ_WORKER = (*_RQ, "publish", "subscribe", "unsubscribe", "client|setname", "client|info", "client|list")


def _shard_glob(key: str) -> str:
    """`ipamgc:alloc:{0}` → `ipamgc:alloc:{*}` (and `…:{0}:<node>` → `…:{*}:*` via the caller's `*`)."""
    head, sep, rest = key.partition("{0}")
    if not sep:
        raise ValueError(f"{key!r} has no shard tag")
    return head + "{*}" + rest


def _grants(*pairs: tuple[str, Access]) -> tuple[KeyGrant, ...]:
    return tuple(KeyGrant(p, a) for p, a in pairs)


def users(keys: Keys) -> tuple[AclUser, ...]:
    """The four users for `keys`' prefix: watcher, worker, leader and the read-only `reader`."""
    w, r = Access.WRITE, Access.READ
    s = {name: _shard_glob(getattr(keys, name)(0)) for name in ("alloc", "dirty", "inflight", "queued")}
    s |= {name: _shard_glob(getattr(keys, name)(0)) for name in ("cand", "due", "decided", "dirtyblocks")}
    s["revalidate"] = _shard_glob(keys.revalidate(0))
    nodeallocs = _shard_glob(keys.nodeallocs(0, "*"))
    nodeblocks = _shard_glob(keys.nodeblocks(0, "*"))
    old_handle = keys.old_handle("*")  # the older layout's, which the watcher deletes when it migrates
    leader = keys.leader("*")
    rq = "rq:*"

    def health(component: str) -> KeyGrant:
        return KeyGrant(keys.health(component, "*"), w)

    watcher = AclUser(
        "watcher",
        keys=(
            *_grants(
                (s["alloc"], w),
                (nodeallocs, w),
                (nodeblocks, w),
                (s["dirtyblocks"], w),
                (s["dirty"], w),
                (s["revalidate"], w),  # a pass over every allocation, started when it opens the gate
                (s["queued"], w),
                # Read only, but passed to `kick` as a script key, which Redis checks for read and write.
                (s["inflight"], w),
                (s["due"], w),  # a vanished allocation's timers go with it
                (s["cand"], w),
                (s["decided"], w),
                (keys.blocks, w),
                (keys.pods, w),
                (keys.nodes, w),
                (keys.handles, w),
                (old_handle, w),
                (keys.pulses, w),
                (keys.wakeups, w),  # BZPOPMIN: the due times its kick waits for
                (keys.old_pulse, w),  # deleted when an older layout is migrated
                (keys.empty, w),
                (keys.coldblocks, w),  # blocks with IPs in cooldown (issue 12)
                (keys.vms, w),  # KubeVirt's VMs and VMIs, slim
                (keys.vmis, w),
                (keys.state, w),
                (keys.cluster, w),  # the cluster it collects (shared/cluster.py)
                (keys.metrics, r),  # the workers' counters, summed and exposed
                (keys.reclaimed, w),  # exposed, and HDEL of the nodes gone with nothing left
                (rq, w),  # it enqueues the shard jobs
            ),
            health("watcher"),
        ),
        commands=(
            *_CONNECTION,
            *_SCRIPTS,
            *_RQ,
            # its own calls: the mirror's writes, the metrics' reads, `kick` and the resync scripts
            "hkeys",
            "hlen",
            "hscan",
            "smembers",
            "pttl",
            "incrby",
            "bzpopmin",
        ),
    )
    worker = AclUser(
        "worker",
        keys=(
            *_grants(
                (s["alloc"], r),
                (nodeallocs, r),
                (nodeblocks, r),
                (s["dirty"], w),
                (s["revalidate"], w),  # a pass over every allocation: its next ids into dirty
                (s["inflight"], w),
                (s["queued"], w),
                (s["cand"], w),
                (s["due"], w),
                (s["decided"], w),
                (keys.blocks, r),
                (keys.pods, r),
                (keys.nodes, r),
                (keys.pulses, r),
                (keys.wakeups, w),  # the earliest due time it wrote, for the watcher's kick
                (keys.state, r),
                (keys.vms, r),  # the VM rule
                (keys.vmis, r),
                (keys.decisions, w),  # XADD only: the leader reads it
                (keys.metrics, w),
                (rq, w),
            ),
            health("worker"),
        ),
        commands=(
            *_CONNECTION,
            *_SCRIPTS,
            *_RQ_WORKER,
            # its own calls beyond RQ's: the lease scripts (redisio/shardqueue/lua.py,
            # workers/shards/linger.py), and the shard job's `queued` flag shortened to one lease at each
            # batch (workers/shards/validate.py)
            "hscan",
            "spop",
            "zmscore",
            "pttl",
            "pexpire",
            "zremrangebyrank",  # `P:wakeups` keeps its earliest member only
        ),
        channels=("rq:pubsub:*",),  # RQ's per-worker command channel (stop, kill-horse)
    )
    leader_user = AclUser(
        "leader",
        keys=(
            *_grants(
                (leader, w),
                (keys.decisions, w),  # the consumer group: XREADGROUP, XACK, XAUTOCLAIM
                (keys.audit, w),
                (keys.cluster, r),  # stamped into its audit records
                (keys.emptyblocks, w),
                (keys.reclaimed, w),
                (keys.handle_gc, w),  # the handle collector's last scan, for `ipamgc status`
                (s["dirtyblocks"], w),  # a cleaned node's CIDRs leave its shard's set
                (keys.wakeups, w),  # a handed-back decision's due time, for the watcher's kick
                (keys.empty, r),
                (keys.coldblocks, r),  # the cold-IP backstop's list
                (keys.state, r),
                (keys.blocks, r),
                (keys.nodes, r),
                (keys.pods, r),
                (keys.handles, r),
                (s["alloc"], r),
                (nodeallocs, r),
                (nodeblocks, r),
            ),
            health("leader"),
        ),
        commands=(
            *_CONNECTION,
            *_SCRIPTS,
            "exists",
            "hget",
            "hmget",
            "hgetall",
            "hkeys",
            "hscan",
            "hset",
            "hdel",
            "hincrby",
            "smembers",
            "scard",
            "srem",
            "zrange",  # BYLEX: a handle's allocations
            "zadd",  # `P:wakeups` (the hand-backs' due times)
            "zremrangebyrank",
            "xgroup|create",
            "xreadgroup",
            "xread",
            "xrevrange",
            "xautoclaim",
            "xack",
            "xadd",
            "set",
            "get",
            "del",
        ),
    )
    reader = AclUser(
        "reader",
        keys=(KeyGrant(f"{keys.prefix}:*", r), KeyGrant(rq, r)),
        commands=(
            *_CONNECTION,
            "get",
            "hget",
            "hmget",
            "hgetall",
            "hlen",
            "scard",
            "smembers",
            "zcard",
            "xlen",
            "xrange",
            "xrevrange",
            "xinfo|groups",
            "llen",
            "exists",
            "scan",
            "info",  # the runbooks' `redis-cli … info memory` (docs/runbooks.md), Redis's own figures
            # rq-dashboard's reads (compose: it runs as this user, ipamgc/dashboard.py)
            "lrange",
            "zrange",
        ),
    )
    return (watcher, worker, leader_user, reader)


@dataclass(frozen=True, slots=True)
class Credential:
    user: str
    password: str


def credential_from_url(component: str, url: str) -> Credential:
    """The user and password of a component's Redis URL (`redis://watcher:<password>@host:6379/0`); the
    user defaults to the component's name (a URL with a password only, `redis://:<password>@…`).  A
    placeholder password (`placeholder_password`) is refused: an ACL made from it would let anyone who
    read deploy/ in."""
    parsed = urlsplit(url)
    if parsed.scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"the {component} URL is not a redis://, rediss:// or unix:// URL")
    if not parsed.password:
        raise ValueError(f"the {component} URL has no password (redis://{component}:<password>@host/0)")
    if placeholder_password(url):
        raise ValueError(f"the {component} URL's password is a placeholder ({PLACEHOLDER_HINT})")
    return Credential(unquote(parsed.username or component), unquote(parsed.password))


# deploy/redis.yaml's Secret ships `change-me-<component>` passwords, to be replaced before it is applied;
# ipamgc refuses to start with one (and the Helm chart refuses to render one).
PLACEHOLDER_PREFIX = "change-me"
PLACEHOLDER_HINT = (
    f'it starts with "{PLACEHOLDER_PREFIX}"; put your own in the Secret, e.g. `openssl rand -hex 24`'
)


def placeholder_password(url: str) -> bool:
    """Whether the Redis URL's password, in its user part or in a `?password=` query (redis-py reads
    both), starts with `change-me` (any case): the placeholder of deploy/'s Secret."""
    try:
        parsed = urlsplit(url)
        passwords = [unquote(parsed.password or "")]
    except ValueError:  # an unparseable URL: redis-py says so when it connects
        return False
    passwords += parse_qs(parsed.query).get("password", [])
    return any(p.lower().startswith(PLACEHOLDER_PREFIX) for p in passwords)


def _hashed(password: str) -> str:
    return "#" + hashlib.sha256(password.encode()).hexdigest()


def user_rule(user: AclUser, password: str) -> str:
    """The `ACL SETUSER <name>` arguments (and the ACL file line after `user <name>`) for `user`; the
    password is stored hashed, so the rule holds no secret in clear."""
    if not password or any(c.isspace() for c in password):
        raise ValueError(f"the {user.name} password must be non-empty, without spaces")
    parts = ["reset", "on", _hashed(password), "-@all"]
    parts += [f"+{c}" for c in sorted(set(user.commands))]
    parts += [f"{g.access.value}{g.pattern}" for g in user.keys]
    parts += [f"&{c}" for c in user.channels]
    return " ".join(parts)


def rules(keys: Keys, credentials: Mapping[str, Credential]) -> list[tuple[str, str]]:
    """(user name, rule) for the default user (PING only: the probes' `redis-cli ping`) and the four
    components, under the names and passwords of `credentials` (by component)."""
    missing = [c for c in COMPONENTS if c not in credentials]
    if missing:
        raise ValueError(f"no credentials for {', '.join(missing)}")
    names = [credentials[c].user for c in COMPONENTS]
    if len(set(names)) != len(names) or "default" in names:
        raise ValueError(f"the components need four distinct user names other than default: {names}")
    out = [("default", "reset on nopass -@all +ping")]
    for u in users(keys):
        cred = credentials[u.name]
        if any(c.isspace() for c in cred.user) or not cred.user:
            raise ValueError(f"bad user name {cred.user!r} for {u.name}")
        out.append((cred.user, user_rule(u, cred.password)))
    return out


def acl_file(keys: Keys, credentials: Mapping[str, Credential]) -> str:
    """A Redis ACL file (`redis-server --aclfile`; the format has no comments: every line is a user)."""
    return "".join(f"user {name} {rule}\n" for name, rule in rules(keys, credentials))
