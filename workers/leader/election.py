"""One leader writes: a Kubernetes Lease elects it, a fencing epoch in Redis fences it.

Why both.  The Lease (coordination.k8s.io/v1, `kubeio.lease.Lease` in `kubeio.election`'s loop)
makes one replica the leader; but a leader can lose it without noticing in time (a long GC pause, a
partition) while a standby takes over.  So on acquiring the Lease a leader takes a new *epoch* (`HINCRBY` on
`P:leader:<lease>`), and every write it makes afterwards is fenced by it:
- a Redis write runs in a Lua script that first checks the stored epoch still equals ours (`Fence`;
  the token compared is `<epoch>:<identity>`, so even a Redis that lost the counter cannot hand two
  leaders the same one);
- a Kubernetes write is preceded by `Fence.check()` (lease still held by our clock, then the epoch), and
  is itself conditional (resourceVersion, delete preconditions): the API server is the real fence, the
  epoch narrows the window in which a stale leader could even try.
Work carrying a stale epoch is refused and logged, and the leader stops (`LostLeadership`).

The Lease is renewed in a thread (`kubeio.election.Elector`, the watcher's loop too); the work asks
`Leadership.held()` before each write.  This module is the Redis half: the epoch and the fenced writes.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import redis

from kubeio.election import Leadership
from shared.errors import IpamgcError
from shared.keys import Keys

log = logging.getLogger("workers.election")  # its pre-split name (#37): log lines unchanged


class LostLeadership(IpamgcError):
    """The Lease is no longer ours (by our clock): stop writing at once and exit."""


class StaleEpoch(LostLeadership):
    """Another leader took a newer epoch: this one's work is refused."""


# -- the epoch and the fenced Redis writes ----------------------------------------------------------------

# The fencing token is `<epoch>:<identity>`: the identity (unique per process) keeps two leaders apart
# even if Redis lost the counter between their elections and both drew the same epoch.
# KEYS[1] leader hash.  ARGV[1] identity, ARGV[2] now (epoch s).  Returns the new epoch.
_ACQUIRE = """
local epoch = redis.call('HINCRBY', KEYS[1], 'epoch', 1)
redis.call('HSET', KEYS[1], 'token', epoch .. ':' .. ARGV[1], 'identity', ARGV[1],
           'acquired_at', ARGV[2], 'heartbeat', ARGV[2])
return epoch
"""

# KEYS[1] leader hash, KEYS[2] the key written.  ARGV[1] our token, ARGV[2] command (HSET, HDEL, SREM, ZADD),
# ARGV[3..] its arguments after the key.  Returns {1, reply}, or {0} when the token is not ours.
_FENCED = """
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return {0} end
return {1, redis.call(ARGV[2], KEYS[2], unpack(ARGV, 3))}
"""

# KEYS[1] leader hash, KEYS[2] decisions stream.  ARGV[1] our token, ARGV[2] group, ARGV[3] consumer,
# ARGV[4] count.  XREADGROUP of new entries: {1, reply} ({1} when none), or {0} when the token is not ours.
_READ = """
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return {0} end
return {1, redis.call('XREADGROUP', 'GROUP', ARGV[2], ARGV[3], 'COUNT', ARGV[4], 'STREAMS', KEYS[2], '>')}
"""

# KEYS[1] leader hash, KEYS[2] decisions stream.  ARGV[1] our token, ARGV[2] group, ARGV[3] consumer,
# ARGV[4] min idle ms, ARGV[5] start id, ARGV[6] count.  {1, XAUTOCLAIM reply} or {0} (epoch not ours).
_CLAIM = """
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return {0} end
return {1, redis.call('XAUTOCLAIM', KEYS[2], ARGV[2], ARGV[3], ARGV[4], ARGV[5], 'COUNT', ARGV[6])}
"""

# KEYS[1] leader hash, KEYS[2] audit stream, KEYS[3] decisions stream.  ARGV[1] our token, ARGV[2] group,
# ARGV[3] audit maxlen, ARGV[4] record count; then per record its field count and field/value pairs;
# the remaining ARGV are decision entry ids to ack.  The audit entries are appended whatever the epoch
# (they are facts, stamped with the epoch they were made under); the ack only under our epoch.
# Returns 1 when acked, 0 when the token is not ours.
_SETTLE = """
local i = 5
for _ = 1, tonumber(ARGV[4]) do
  local n = tonumber(ARGV[i])
  local args = {'XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], '*'}
  for j = i + 1, i + n do args[#args + 1] = ARGV[j] end
  redis.call(unpack(args))
  i = i + n + 1
end
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
if i <= #ARGV then redis.call('XACK', KEYS[3], ARGV[2], unpack(ARGV, i)) end
return 1
"""

_FENCED_COMMANDS = frozenset({"HSET", "HDEL", "SREM", "ZADD"})


class Fence:
    """The epoch of one leader, and the Redis writes it fences."""

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        lease: str,
        leadership: Leadership,
    ) -> None:
        self.redis = client
        self.keys = keys
        self.key = keys.leader(lease)
        self.leadership = leadership
        self.epoch = 0
        self._acquire = client.register_script(_ACQUIRE)
        self._fenced = client.register_script(_FENCED)
        self._read = client.register_script(_READ)
        self._claim = client.register_script(_CLAIM)
        self._settle = client.register_script(_SETTLE)

    @property
    def extra(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "identity": self.leadership.identity}

    def acquire(self, now: float) -> int:
        """Take a new epoch (on acquiring the Lease): every older one is stale from now on."""
        self.epoch = int(self._acquire(keys=[self.key], args=[self.leadership.identity, repr(now)]))
        log.info("leading with epoch %s", self.epoch, extra=self.extra)
        return self.epoch

    @property
    def token(self) -> str:
        return f"{self.epoch}:{self.leadership.identity}"

    def check(self) -> None:
        """Before a Kubernetes write: the Lease is ours by our clock and the epoch is still ours."""
        if not self.leadership.held():
            raise LostLeadership(f"{self.leadership.identity}: the lease is no longer held")
        raw = self.redis.hget(self.key, "token")
        stored = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
        if stored != self.token:
            raise StaleEpoch(f"epoch {self.token} is stale (Redis holds {stored})")

    def _refused(self, what: str) -> StaleEpoch:
        log.error("refused %s: epoch %s is stale", what, self.epoch, extra=self.extra)
        return StaleEpoch(f"{what}: epoch {self.epoch} is stale")

    def _held(self, what: str) -> None:
        if not self.leadership.held():
            log.error("refused %s: the lease is no longer held", what, extra=self.extra)
            raise LostLeadership(f"{what}: the lease is no longer held")

    def write(self, command: str, key: str, *args: str | bytes | float) -> Any:
        """`command key args…` if the Lease is held and the epoch is ours, else LostLeadership."""
        if command not in _FENCED_COMMANDS:
            raise ValueError(f"{command} is not a fenced command")
        self._held(f"{command} {key}")
        reply = self._fenced(keys=[self.key, key], args=[self.token, command, *args])
        if not reply or reply[0] != 1:
            raise self._refused(f"{command} {key}")
        return reply[1]

    def heartbeat(self, now: float) -> None:
        self.write("HSET", self.key, "heartbeat", repr(now))

    def read(self, stream: str, group: str, consumer: str, count: int) -> list[Any]:
        """New entries of `stream` for `consumer` (XREADGROUP `>`), raw: [[id, [f, v, …]], …]."""
        self._held(f"XREADGROUP {stream}")
        reply = self._read(keys=[self.key, stream], args=[self.token, group, consumer, count])
        if not reply or reply[0] != 1:
            raise self._refused(f"XREADGROUP {stream}")
        if len(reply) < 2 or not reply[1]:
            return []
        return list(reply[1][0][1])

    def claim(self, stream: str, group: str, consumer: str, min_idle_ms: int, count: int) -> list[Any]:
        """XAUTOCLAIM every pending entry idle ≥ `min_idle_ms` (all consumers) to `consumer`."""
        self._held(f"XAUTOCLAIM {stream}")
        claimed: list[Any] = []
        start: bytes | str = "0-0"
        while True:
            reply = self._claim(
                keys=[self.key, stream], args=[self.token, group, consumer, min_idle_ms, start, count]
            )
            if not reply or reply[0] != 1:
                raise self._refused(f"XAUTOCLAIM {stream}")
            cursor, entries = reply[1][0], reply[1][1]
            claimed.extend(e for e in entries if e)  # a trimmed entry comes back empty (Redis 6.2)
            if cursor in (b"0-0", "0-0"):
                return claimed
            start = cursor

    def settle(
        self,
        audit: str,
        audit_maxlen: int,
        records: Sequence[Sequence[str]],
        stream: str,
        group: str,
        ack: Sequence[str],
    ) -> bool:
        """Append audit `records` (flat field/value lists); ack `ack` if the Lease is held and the epoch
        is still ours (returns whether it was).  The records are appended either way."""
        held = self.leadership.held()
        if not held:
            ack = []
        args: list[str | int] = [self.token, group, audit_maxlen, len(records)]
        for rec in records:
            args.append(len(rec))
            args.extend(rec)
        args.extend(ack)
        return bool(self._settle(keys=[self.key, audit, stream], args=args)) and held
