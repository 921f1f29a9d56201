"""The mirror's `P:state` hash as the watcher writes it: the layout, the configuration, the synced marker.

Why a module: these few fields are the watcher's contract with every other process, apart from the
per-allocation data of `producer/mirror.py`.  The shard count is recorded once and a Redis laid out for
another count is refused; the leak grace period and datastore readiness are written when they change (a
change dirties everything); IPAMConfig's cooldown is written for the leader; `synced` (or, while listing,
the `listing` marker) gates the workers.  Writing the gate open kicks every shard with work
(`producer/arming.py`), since nothing was armed while it was shut.  A change of the grace period is
stamped too (`leak_grace_since`, on `clock`: Redis's `TIME` in a deployment, the workers' clock): Calico
restarts on it and so starts every leak timer again, and the workers and the leader count every timer
started before the stamp from it.
"""

from __future__ import annotations

import logging

import redis

from producer.arming import ShardArming
from shared import keys as k
from shared.clock import Clock
from shared.errors import ConfigError
from shared.keys import Keys

log = logging.getLogger(__name__)


class StateHash:
    """Writes of `P:state` (see the module docstring); the gate it writes is kept in `arming`."""

    def __init__(
        self, redis_client: redis.Redis, keys: Keys, shards: int, arming: ShardArming, clock: Clock
    ) -> None:
        self.redis = redis_client
        self.keys = keys
        self.shards = shards
        self.arming = arming
        self.clock = clock  # stamps a grace period change: the clock the workers' timers are on

    def ensure_layout(self) -> None:
        """Record the shard count; refuse to run against a Redis laid out for another one."""
        self.redis.hsetnx(self.keys.state, k.STATE_SHARDS, str(self.shards))
        stored = _opt_bytes(self.redis.hget(self.keys.state, k.STATE_SHARDS))
        if stored is not None and stored != str(self.shards).encode():
            raise ConfigError(
                f"Redis holds data for {stored.decode(errors='replace')} shards, this watcher runs "
                f"{self.shards}: flush the {self.keys.prefix} keys first"
            )

    def set_config(self, grace: float | None, datastore_ready: bool) -> bool:
        """Store the leak grace period (seconds, None = unset) and readiness; a change dirties everything."""
        self.ensure_layout()
        before = self.redis.hmget(self.keys.state, [k.STATE_GRACE, k.STATE_DATASTORE_READY])
        grace_text = None if grace is None else repr(float(grace))
        ready_text = "1" if datastore_ready else "0"
        pipe = self.redis.pipeline(transaction=False)
        if grace_text is None:
            pipe.hdel(self.keys.state, k.STATE_GRACE)
        else:
            pipe.hset(self.keys.state, k.STATE_GRACE, grace_text)
        pipe.hset(self.keys.state, k.STATE_DATASTORE_READY, ready_text)
        pipe.execute()
        arming = self.arming
        opened = arming.ready is False and datastore_ready
        arming.ready = datastore_ready
        configured_before = before[1] is not None
        grace_changed = configured_before and before[0] != (grace_text.encode() if grace_text else None)
        changed = grace_changed or (configured_before and before[1] != ready_text.encode())
        if grace_changed:
            # Calico exits on a change of its configuration and its timers start again: so do ours.
            since = repr(float(self.clock.now()))
            self.redis.hset(self.keys.state, k.STATE_GRACE_SINCE, since)
            log.info("leak grace period changed: every leak timer restarts", extra={"since": since})
        if changed:
            log.info("configuration changed, re-validating every allocation", extra={"grace": grace_text})
            arming.mark_all_dirty()  # kicks
        elif opened:
            arming.kick()
        return changed

    def set_ip_cooldown(self, seconds: int | None) -> None:
        """Store IPAMConfig `default`'s cooldown (seconds) for the leader; None: forget it (this watcher
        has not listed IPAMConfigs yet, and the leader reads the live object instead)."""
        if seconds is None:
            self.redis.hdel(self.keys.state, k.STATE_IP_COOLDOWN)
        else:
            self.redis.hset(self.keys.state, k.STATE_IP_COOLDOWN, str(int(seconds)))

    def mark_synced(self, synced: bool = True) -> None:
        """The initial list of every kind is mirrored: workers may now treat a missing pod as gone.
        Not yet: the `listing` marker is set instead, so a Redis that loses its data while we list is
        told by the marker's absence (the watcher checks it before it marks the mirror synced)."""
        pipe = self.redis.pipeline(transaction=False)
        revalidate = synced and self.arming.revalidate
        if revalidate:
            # Before `synced`: a replica that has the gate open has the passes too.
            name = f"{self.clock.now():.6f}"
            for s in range(self.shards):
                pipe.set(self.keys.revalidate(s), f"{name}:0")
        if synced:
            pipe.hset(self.keys.state, k.STATE_SYNCED, "1")
            pipe.hdel(self.keys.state, k.STATE_LISTING)
        else:
            pipe.hdel(self.keys.state, k.STATE_SYNCED)
            pipe.hset(self.keys.state, k.STATE_LISTING, "1")
        pipe.execute()
        self.arming.synced = synced
        if revalidate:
            self.arming.revalidate = False
            log.info("first list mirrored: the workers re-validate every allocation, a batch at a time")
        if synced:
            self.arming.kick()


def _opt_bytes(value: object) -> bytes | None:
    """Narrow a Redis reply: this code runs with `decode_responses=False`, so values are bytes."""
    if value is None or isinstance(value, bytes):
        return value
    raise TypeError(f"expected bytes from Redis, got {type(value).__name__} (use decode_responses=False)")
