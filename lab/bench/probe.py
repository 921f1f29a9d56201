"""The benchmark's own view of Redis: progress questions, and the commands it spends asking them.

Why a module of its own: the benchmark must ask Redis whether the system is done (synced, nothing dirty,
nothing leased, no job queued) without polluting the figure it reports, Redis commands per event.  Every
command sent from here is counted by name in `own`, and `commands()` returns INFO commandstats with those
subtracted, so a phase's command count is ipamgc's alone.  (Commands run inside Lua scripts are counted by
Redis on their own as well as the EVALSHA that ran them; that is Redis's accounting, kept as it is.)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import redis

from shared import keys as k
from shared.codec import RecordError
from shared.gcrecords import Decision, decode_decision
from shared.keys import Keys
from shared.shard import DEFAULT_SHARDS, shard_of

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Commands:
    """Redis commands by name, ipamgc's only (the probe's own subtracted)."""

    by_name: Mapping[str, int]

    def minus(self, earlier: Commands) -> dict[str, int]:
        out = {n: c - earlier.by_name.get(n, 0) for n, c in self.by_name.items()}
        return {n: c for n, c in out.items() if c}


class Probe:
    """Progress questions about one ipamgc deployment in Redis, with its own commands accounted for."""

    def __init__(self, client: redis.Redis, keys: Keys | None = None, shards: int = DEFAULT_SHARDS) -> None:
        self.redis = client
        self.keys = keys or Keys()
        self.shards = shards
        self.own: Counter[str] = Counter()

    def _run(self, commands: Iterable[tuple[str, tuple[Any, ...]]]) -> list[Any]:
        pipe = self.redis.pipeline(transaction=False)
        for name, args in commands:
            getattr(pipe, name)(*args)
            self.own[name] += 1
        return list(pipe.execute())

    # -- what Redis itself reports ------------------------------------------------------------------------

    def commands(self) -> Commands:
        """INFO commandstats minus everything this probe sent before this call."""
        own = Counter(self.own)  # this INFO is counted by Redis after it answers: in the next reading
        info = self.redis.info("commandstats")
        self.own["info"] += 1
        stats = {str(n).removeprefix("cmdstat_"): int(v["calls"]) for n, v in info.items()}
        return Commands({n: c - own.get(n, 0) for n, c in stats.items()})

    def memory(self) -> dict[str, float]:
        info = self.redis.info("memory")
        self.own["info"] += 1
        return {
            "used_memory_mib": round(int(info["used_memory"]) / MIB, 1),
            "used_memory_peak_mib": round(int(info["used_memory_peak"]) / MIB, 1),
            "used_memory_rss_mib": round(int(info["used_memory_rss"]) / MIB, 1),
        }

    def ping(self) -> bool:
        try:
            ok = bool(self.redis.ping())
        except (redis.ConnectionError, redis.TimeoutError):
            return False
        self.own["ping"] += 1
        return ok

    # -- progress -----------------------------------------------------------------------------------------

    def synced(self) -> bool:
        (value,) = self._run([("hget", (self.keys.state, k.STATE_SYNCED))])
        return bool(value == b"1")

    def workers(self) -> int:
        """RQ workers registered (RQ keeps them in the `rq:workers` set)."""
        (n,) = self._run([("scard", ("rq:workers",))])
        return int(n)

    def allocations(self) -> int:
        """Allocations mirrored (with a `node` attribute, i.e. subject to validation)."""
        return sum(int(n) for n in self._run([("hlen", (self.keys.alloc(s),)) for s in range(self.shards)]))

    def quiescent(self, candidates: bool = False) -> bool:
        """Nothing dirty, leased, left of a revalidation pass or waiting for a job in any shard (and, with
        `candidates`, no candidate timer due).  A `queued` flag that holds a running job's token (`j:…`) is
        not work: a long-lived job lingers on its shards for a while after draining them
        (`workers/shards/linger.py`); a flag `1` is a job still waiting to run."""
        cmds: list[tuple[str, tuple[Any, ...]]] = []
        for s in range(self.shards):
            cmds += [("scard", (self.keys.dirty(s),)), ("zcard", (self.keys.inflight(s),))]
            cmds.append(("exists", (self.keys.revalidate(s),)))  # a pass over every allocation
            if candidates:
                cmds.append(("zcard", (self.keys.due(s),)))
        flags = [("get", (self.keys.queued(s),)) for s in range(self.shards)]
        replies = self._run(cmds + flags)
        counts, values = replies[: len(cmds)], replies[len(cmds) :]
        return not any(int(v) for v in counts) and all(v is None or v != b"1" for v in values)

    def last_full_resync(self) -> bytes | None:
        """`P:state` `last_full_resync`: the watcher writes it at the end of each periodic pass (a new
        value: a pass ended); None before the first."""
        (value,) = self._run([("hget", (self.keys.state, k.STATE_LAST_FULL_RESYNC))])
        return value if isinstance(value, bytes) else None

    def jobs_done(self) -> bool:
        """No shard has a job, running (a long-lived job lingers on its shards for `--job-idle` after
        draining them, polling for more) or waiting."""
        values = self._run([("get", (self.keys.queued(s),)) for s in range(self.shards)])
        return all(v is None for v in values)

    def pod_mirrored(self, namespace: str, name: str) -> bool:
        (found,) = self._run([("hexists", (self.keys.pods, k.pod_key(namespace, name)))])
        return bool(found)

    def allocation_mirrored(self, node: str, alloc_id: str) -> bool:
        shard = shard_of(node, self.shards)
        (found,) = self._run([("hexists", (self.keys.alloc(shard), alloc_id))])
        return bool(found)

    def leader_pending(self, group: str = "leader") -> int | None:
        """Decisions read by the leader and not yet acked (None: the leader has not created its group)."""
        try:
            (summary,) = self._run([("xpending", (self.keys.decisions, group))])
        except redis.ResponseError:
            return None
        return int(summary["pending"]) if isinstance(summary, dict) else None

    def decisions(self, since_ms: int = 0) -> list[Decision]:
        """Decisions appended to the stream since `since_ms` (epoch milliseconds), oldest first."""
        out: list[Decision] = []
        start = f"{since_ms}-0"
        while True:
            (entries,) = self._run([("xrange", (self.keys.decisions, start, "+", 1000))])
            for _entry_id, fields in entries:
                raw = fields.get(b"d")
                if isinstance(raw, bytes):
                    try:
                        out.append(decode_decision(raw))
                    except RecordError:
                        continue
            if len(entries) < 1000:
                return out
            last = entries[-1][0].decode()
            ms, seq = last.split("-")
            start = f"{ms}-{int(seq) + 1}"

    def close(self) -> None:
        self.redis.close()
