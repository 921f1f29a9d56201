"""`ipamgc status`: the state of the whole system, read from Redis alone.

Per shard: dirty, in-flight and candidate counts and RQ queue depth; the workers RQ knows (alive, last
heartbeat); the leader (identity, epoch, time since it acquired the Lease, heartbeat age); the watcher's
state (synced, datastore ready, grace period, last full resync, KubeVirt's VM rule on); decisions waiting
for the leader; the leader's recent outcomes by result; and its handle collector's counts per class.  A
pipeline of O(shards) cheap commands: safe to run every second.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import redis
from rq import Worker

from shared.keys import (
    STATE_DATASTORE_READY,
    STATE_GRACE,
    STATE_IP_COOLDOWN,
    STATE_KUBEVIRT,
    STATE_LAST_FULL_RESYNC,
    STATE_SHARDS,
    STATE_SYNCED,
    Keys,
)

AUDIT_SAMPLE = 2000  # recent audit entries counted by result
LEADER_LEASE = "ipamgc-leader"


@dataclass
class ShardStatus:
    shard: int
    dirty: int
    inflight: int
    candidates: int
    due: int
    queue: int
    revalidating: bool = False  # a pass over every allocation is pending (`P:revalidate:{s}`)


@dataclass
class Status:
    now: float
    synced: bool
    datastore_ready: bool
    leak_grace_period: float | None
    last_full_resync_age: float | None
    shards: list[ShardStatus]
    workers: list[dict[str, Any]]
    leader: dict[str, Any]
    decisions: dict[str, int]
    releases: dict[str, int]
    totals: dict[str, int] = field(default_factory=dict)
    kubevirt: bool = False  # the VM rule applies (the watcher has listed KubeVirt's VMs and VMIs)
    ip_cooldown: int | None = None  # IPAMConfig's, as the watcher mirrors it (None: not mirrored)
    # The leader's handle collector at its last scan (`P:handlegc`, docs/handles.md): `at` (age, s),
    # `dry_run`, `handles`, `blocks`, and per class `divergent`, `due`, `repaired`, `refused`; {}: none yet.
    handle_gc: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _int(value: bytes | str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _f(value: bytes | str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def read_status(
    client: redis.Redis, keys: Keys, shards: int | None = None, now: float | None = None
) -> Status:
    now = time.time() if now is None else now
    state = {_text(k): v for k, v in client.hgetall(keys.state).items()}
    count = shards or int(_f(state.get(STATE_SHARDS)) or 16)
    pipe = client.pipeline(transaction=False)
    for s in range(count):
        pipe.scard(keys.dirty(s))
        pipe.zcard(keys.inflight(s))
        pipe.hlen(keys.cand(s))
        pipe.zcard(keys.due(s))
        pipe.llen(f"rq:queue:{keys.queue_name(s)}")
        pipe.exists(keys.revalidate(s))
    pipe.hgetall(keys.leader(LEADER_LEASE))
    pipe.xlen(keys.decisions)
    pipe.xrevrange(keys.audit, count=AUDIT_SAMPLE)
    pipe.hgetall(keys.handle_gc)
    results = pipe.execute()
    shard_rows = []
    for s in range(count):
        d, i, c, due, q, pending = results[s * 6 : s * 6 + 6]
        shard_rows.append(ShardStatus(s, int(d), int(i), int(c), int(due), int(q), bool(pending)))
    leader_raw, decisions_len, audit, handle_gc_raw = results[count * 6 :]
    leader = {_text(k): _text(v) for k, v in leader_raw.items()}
    acquired, heartbeat = _f(leader_raw.get(b"acquired_at")), _f(leader_raw.get(b"heartbeat"))
    leader_view: dict[str, Any] = {
        "identity": leader.get("identity", ""),
        "epoch": int(leader.get("epoch", "0") or 0),
        "lease_age": round(now - acquired, 1) if acquired else None,
        "heartbeat_age": round(now - heartbeat, 1) if heartbeat else None,
    }
    pending = 0
    try:
        info = client.xinfo_groups(keys.decisions)
        pending = sum(int(g.get("pending", 0)) for g in info if g.get("name") in (b"leader", "leader"))
    except redis.ResponseError:
        pending = 0  # no stream or no group yet
    releases = Counter(
        fields.get(b"result", b"?").decode(errors="replace")
        for _, fields in audit
        if isinstance(fields, dict)
    )
    workers = []
    for w in Worker.all(connection=client):
        beat = w.last_heartbeat.timestamp() if w.last_heartbeat else None
        workers.append(
            {
                "name": w.name,
                "state": str(w.get_state()),
                "queues": len(w.queue_names()),
                "heartbeat_age": round(now - beat, 1) if beat else None,
                "successful_jobs": w.successful_job_count,
                "failed_jobs": w.failed_job_count,
            }
        )
    last_resync = _f(state.get(STATE_LAST_FULL_RESYNC))
    totals = {
        "dirty": sum(r.dirty for r in shard_rows),
        "inflight": sum(r.inflight for r in shard_rows),
        "candidates": sum(r.candidates for r in shard_rows),
        "queued_jobs": sum(r.queue for r in shard_rows),
        "revalidating_shards": sum(r.revalidating for r in shard_rows),
    }
    return Status(
        now=now,
        synced=state.get(STATE_SYNCED) == b"1",
        datastore_ready=state.get(STATE_DATASTORE_READY, b"1") == b"1",
        leak_grace_period=_f(state.get(STATE_GRACE)),
        ip_cooldown=_int(state.get(STATE_IP_COOLDOWN)),
        last_full_resync_age=round(now - last_resync, 1) if last_resync else None,
        shards=shard_rows,
        workers=workers,
        leader=leader_view,
        decisions={"stream": int(decisions_len), "pending": pending},
        releases=dict(sorted(releases.items())),
        totals=totals,
        kubevirt=state.get(STATE_KUBEVIRT) == b"1",
        handle_gc=handle_gc_view(handle_gc_raw, now),
    )


def handle_gc_view(raw: dict[bytes, bytes], now: float) -> dict[str, Any]:
    """`P:handlegc` as `status` shows it: per class `{divergent, due, repaired, refused}` and the scan."""
    if not raw:
        return {}
    fields = {_text(k): _text(v) for k, v in raw.items()}
    classes: dict[str, dict[str, int]] = {}
    for key, value in fields.items():
        what, _, cls = key.partition("|")
        if cls:
            classes.setdefault(cls, {})[what] = _int(value) or 0
    at = _f(fields.get("at"))
    return {
        "scan_age": round(now - at, 1) if at else None,
        "dry_run": fields.get("dry_run") == "1",
        "handles": _int(fields.get("handles")),
        "blocks": _int(fields.get("blocks")),
        "classes": dict(sorted(classes.items())),
    }
