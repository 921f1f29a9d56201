"""Long-lived shard jobs: one RQ job keeps serving its shard, and adopts others, while work keeps coming.

An RQ job costs ~2 ms of worker CPU and ~60 Redis commands whatever it does, and every watcher batch touches
nearly every shard, so a job per shard per batch costs far more than validating the ids.  A lingering job
instead stays after its shard is drained: it blocks on the one `pulses` stream the watcher appends to per
batch that made work (an XREAD BLOCK until the next entry, or until the next thing it has to do, at most
`poll` seconds) and looks at its shards only when a pulse arrived, a due time it knows of passed, or
`backstop` seconds passed since its last look.  One look is one pipeline: the `state` gate plus one `STEP`
script per held shard (once per `backstop` period renew the flag and reap expired leases; promote due
candidates; take its part of a batch: `batch_size` ids in all, shared among the held shards; report the
earliest due time), and, every `adopt_every`, the flags of the served shards it does not hold.  It ends
after `idle` seconds without work, after its budget, or on a stop request, releasing its flags (re-armed
and re-enqueued where ids remain, as `ShardQueue.finish` does).

Holding a shard = its `queued:{s}` flag holds this job's token (any value but `1`, which the watcher,
`kick` and `finish` write for a job that is pending), with a TTL of at most one work lease, renewed
well within it: `kick` reads a PTTL at most one lease as "a live job runs here" and leaves it alone.
So the watcher enqueues nothing for a held shard, and a job started for it exits at once.  A job adopts
(up to its fair share: served shards / live workers serving them) shards whose flag is absent, or `1`
with a PTTL above one lease (armed for a job still waiting in a queue, which then finds it held); past
its share, one whose job has waited `WAITING_ADOPT_SECONDS` (every worker busy lingering: no job of the
queue would start before one of them ends).
At light load (`Linger.light_below`) a job gathers every served shard, taking those of lingering jobs
whose token sorts after its own (they let go at their next renewal): one job wakes per pulse, not one per
worker.  Busy (`Linger.heavy_above`), it gives back the shards past its fair share, re-armed and enqueued.
Exclusivity only saves cost: concurrent jobs on one shard are harmless (leases dedupe ids, candidate
timers use HSETNX, the leader dedupes decisions).

This module is the job's loop: when to look, what a look does with its replies, adoption and letting go.
The scripts a look runs are the shard queue's protocol (`redisio.shardqueue`: `ShardFlags` runs them), the
wait for a pulse is in `workers.shards.pulse`, and the process-wide tuning and stop request of the jobs in
`workers.shards.job_tuning`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import redis

from redisio import luapipe
from redisio.heldconn import HeldConnection
from redisio.shardqueue.queue import Lease, ShardFlags, ShardQueue
from shared.clock import Clock
from shared.keys import QUEUED_TTL_SECONDS, Keys
from workers.common.redis_state import STATE_FIELDS, GlobalState, parse_state, read_state
from workers.shards.busy import BusyWindow
from workers.shards.linger_config import Linger, LingerStats
from workers.shards.pulse import MIN_WAIT_SECONDS, Pulse, StreamPulse

__all__ = ["Linger", "LingerStats", "Lingerer"]  # the tuning re-exported: its importers predate the split

log = logging.getLogger("workers.linger")  # its pre-split name (#37): log lines unchanged

# A shard whose job has waited this long in the queue is adopted past a lingering job's fair share.
WAITING_ADOPT_SECONDS = 2.0


W = TypeVar("W")  # what `make` builds for a held shard: the work the batch validator is handed
# Validates the held shards' batches at once (`workers.shards.batches.validate_batches`): their due times.
BatchValidator = Callable[[Sequence[tuple[W, Lease]], GlobalState, float], list[float | None]]


@dataclass(slots=True)
class _Held(Generic[W]):
    work: W
    next_due: float | None = None  # epoch s; None: unknown (promote at the next look)


class Lingerer(Generic[W]):
    """One lingering job: `run()` serves `shard` and adopted shards until idle, budget or stop."""

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        clock: Clock,
        make: Callable[[int], W],
        *,
        linger: Linger,
        lease: float,
        batch_size: int,
        budget: float,
        per_node: bool,
        monotonic: Callable[[], float],
        pulse: Pulse | None = None,
        batch: BatchValidator[W],
        queued_ttl: float = QUEUED_TTL_SECONDS,
        held: HeldConnection | None = None,
        enqueue: Callable[[int], None] | None = None,
    ) -> None:
        self.redis, self.keys, self.clock, self.make = client, keys, clock, make
        self.enqueue = enqueue  # a shard given back with ids left gets its job here
        # The job's kept connection for its looks, waits and writes (`redisio.heldconn`); its owner
        # gives it back when the job ends.
        self.conn = held
        self.batch = batch
        self.linger, self.lease, self.batch_size, self.budget = linger, lease, batch_size, budget
        self.per_node, self.monotonic = per_node, monotonic
        self.pulse: Pulse = pulse if pulse is not None else StreamPulse(client, keys, held)
        self.hold_ms = max(1, int(lease * 1000))
        self.queued_ttl_ms = int(queued_ttl * 1000)
        # Within a third of the flag's hold, so a flag never lapses while its job lingers.
        self.look_every = min(lease / 3, linger.backstop)
        self._chores_at = -math.inf
        self.flags = ShardFlags(client, keys)  # the `queued:{s}` flags: hold, step, release
        self.held: dict[int, _Held[W]] = {}
        self.stats = LingerStats()
        # The looks' share of the job's time: light, it gathers shards; heavy, it gives some back.
        self.load = BusyWindow(
            linger.light_below, linger.heavy_above, linger.adopt_every, enabled=linger.concentrate
        )
        self._own = -1  # the shard the job was enqueued for
        self._again: set[int] = set()  # shards the next look steps whatever the pulses name

    def run(self, shard: int) -> LingerStats:
        lin = self.linger
        got = self.flags.hold(shard, lin.token, self.hold_ms, "own")
        if got != 1:
            self.stats.held_elsewhere = got == 0
            return self.stats
        # The gate first: a job that took a batch only to find the gate shut would hand it back id by id
        # (NACK), as every job armed during a cold start's listing once did (~3 times per allocation).
        state = read_state(self.redis, self.keys)
        if not state.ready:
            self.stats.gated = state
            self.flags.release(shard, lin.token, self.queued_ttl_ms, False)  # the gate's opening kicks
            return self.stats
        start = self.monotonic()
        self._own = shard
        self.held[shard] = _Held(self.make(shard))
        stop_at, last_work = start + self.budget, start
        # One deadline: the next look comes at the latest `look_every` after the last one, and the
        # chores (renew, reap, the backstop promotion) ride on whichever look comes once they are due.
        # During churn the pulses come first and no look is made for the chores alone.  Adoption rides
        # on a look too (its flags are read in the look's pipeline): it never wakes the job by itself.
        next_look = next_adopt = start
        self.load.start(start)
        pulse = self.pulse.newest()
        look = True
        rearm = True
        try:
            while self.held and not lin.stop():
                m = self.monotonic()
                if m >= stop_at or m - last_work >= lin.idle:
                    break
                now = self.clock.now()
                due = any(h.next_due is not None and h.next_due <= now for h in self.held.values())
                if not (look or due or m >= next_look):
                    self.stats.polls += 1
                    # Wait for a pulse until the next thing to do (the next look, a due time, the idle end
                    # or the budget), at most `poll`.
                    until = min(next_look, stop_at, last_work + lin.idle)
                    dues = [h.next_due for h in self.held.values() if h.next_due is not None]
                    if dues:
                        until = min(until, m + min(dues) - now)
                    seen = self.pulse.wait(pulse, min(lin.poll, max(MIN_WAIT_SECONDS, until - m)))
                    look, pulse = seen != pulse, seen
                    continue  # time passed: the budget, idle end and stop are looked at again first
                adopt = m >= next_adopt
                taken, full, adopted = self._look(now, m, adopt)
                self.load.add(self.monotonic() - m)
                next_look = m + self.look_every
                if adopt:
                    next_adopt = m + lin.adopt_every
                if self.stats.gated is not None:
                    rearm = False
                    break
                if taken:
                    last_work = self.monotonic()
                look = full or adopted  # more may be waiting, or new shards: look again at once
        finally:
            self._release_all(rearm)
        return self.stats

    def _look(self, now: float, m: float, adopt: bool) -> tuple[bool, bool, bool]:
        """One pipeline over the held shards (and, with `adopt`, the flags of the served shards not
        held); validates what it took, then adopts.  Returns (took any, any full, adopted any)."""
        self.stats.looks += 1
        pipe = self.redis.pipeline(transaction=False)
        pipe.hmget(self.keys.state, list(STATE_FIELDS))
        # Renewing the flags, reaping expired leases and the backstop promotion are due once per
        # `look_every`: a job woken by pulses every second does them at most every other look (five
        # Redis commands a shard).  Due candidates are promoted whenever one is due.
        chores = m - self._chores_at >= self.look_every
        if chores:
            self._chores_at = m
        order = self._to_look(now, chores)
        promoting: set[int] = set()
        # At most `batch_size` ids a look in all, shared among the held shards: a look's memory is bounded
        # by the batch, not by the shards gathered (a relist fills all of them at once).
        per_shard = max(1, self.batch_size // max(1, len(order)))
        for s in order:
            h = self.held[s]
            promote = not self.per_node and (chores or h.next_due is None or h.next_due <= now)
            if promote:
                promoting.add(s)
            self.flags.step_in(
                pipe, s, self.linger.token, self.hold_ms, now, self.lease, per_shard,
                renew=chores, reap=chores, promote=promote,
            )  # fmt: skip
        served = [s for s in self.linger.served if s not in self.held] if adopt else []
        for s in served:
            self.flags.read_in(pipe, s)
        replies = luapipe.execute(pipe, self.redis, [self.flags.step_script], self.conn)
        state_raw, steps, flags = replies[0], replies[1 : 1 + len(order)], replies[1 + len(order) :]
        state = parse_state(state_raw)
        leases: list[tuple[int, Lease]] = []
        passes: dict[int, bytes] = {}  # shard → its pending revalidation pass, as the look read it
        for s, reply in zip(order, steps, strict=True):
            if not int(reply[0]):
                log.info("shard now held by another job: let go", extra={"shard": s})
                del self.held[s]
                continue
            deadline, ids, reaped, promoted, nextdue, revalidating = reply[1:]
            if revalidating:
                passes[s] = revalidating
            self.stats.reaped += int(reaped)
            self.stats.promoted += int(promoted)
            h = self.held[s]
            if s in promoting:  # the reply is the truth about the shard's earliest due time
                h.next_due = float(nextdue) if nextdue else math.inf
            leases.append((s, self._lease(s, deadline, ids)))
        taken = any(lease.ids for _, lease in leases)
        if not state.ready:
            for s, lease in leases:
                if lease.ids:
                    self._nack(s, lease)
            self.stats.gated = state
            return False, False, False
        full = False
        work = [(s, lease) for s, lease in leases if lease.ids]
        dues = self.batch([(self.held[s].work, lease) for s, lease in work], state, now)
        for (s, lease), due in zip(work, dues, strict=True):
            if due is not None:
                h = self.held[s]
                h.next_due = due if h.next_due is None else min(h.next_due, due)
            if len(lease.ids) + lease.dropped >= per_shard:
                full = True
                self._again.add(s)  # more may be waiting there: in the next look whatever it names
        short = {s for s, lease in leases if len(lease.ids) + lease.dropped < per_shard}
        for s, value in passes.items():
            # A pass over every allocation (a cold start): once dirty runs short, its next ids go there
            # for the next look.
            if (
                s in short
                and s in self.held
                and ShardQueue(self.redis, self.keys, s).refill(per_shard, value)
            ):
                full = True
                self._again.add(s)
        adopted = False
        if adopt:
            if self.load.judge(m):
                self._give_back()
            elif served:
                adopted = self._adopt(m, list(zip(served, flags[::2], flags[1::2], strict=True)))
        return taken, full, adopted

    def _to_look(self, now: float, chores: bool) -> list[int]:
        """The held shards a look steps: every one at a chores look (the backstop, each `look_every`) or
        when the pulses read named none; otherwise those the pulses named, those due or of unknown due
        time, those left full and those just adopted.  At light load a batch makes work in one or two
        shards: stepping the others (an empty SPOP script each) was most of a look's Redis work."""
        named = self.pulse.take_named()
        again, self._again = self._again, set()
        if chores or named is None:
            return sorted(self.held)
        return sorted(
            s
            for s, h in self.held.items()
            if s in named or s in again or h.next_due is None or h.next_due <= now
        )

    def _share(self) -> int:
        live = max(1, self.linger.workers() if self.linger.workers is not None else 1)
        return math.ceil(len(self.linger.served) / live)

    def _give_back(self) -> None:
        """Busy: let go of the held shards beyond the fair share (it keeps its own shard and the lowest
        others), re-armed and enqueued where ids remain."""
        excess = sorted(self.held, key=lambda x: (x != self._own, x))[self._share() :]
        if not excess:
            return
        rearmed = self._let_go(excess, rearm=True)
        for s in excess:
            del self.held[s]
        if self.enqueue is not None:
            for s in rearmed:
                self.enqueue(s)
        self.stats.given_back += len(excess)
        log.debug("busy: gave back shards %s", excess)

    def _lease(self, s: int, deadline: bytes, ids: Sequence[bytes]) -> Lease:
        good: list[str] = []
        bad: list[bytes] = []
        for raw in ids:
            try:
                good.append(raw.decode())
            except UnicodeDecodeError:
                bad.append(raw)
        if bad:
            log.warning("dropped %d dirty members that are not text: %r", len(bad), bad[:3])
            self.redis.zrem(self.keys.inflight(s), *bad)
            self.stats.dropped += len(bad)
        return Lease(deadline.decode(), tuple(good), len(bad))

    def _nack(self, s: int, lease: Lease) -> None:
        """Give an untouched batch back (the shard's own NACK: only where the lease is still ours)."""
        ShardQueue(self.redis, self.keys, s).nack(lease)

    def _adopt(self, m: float, flags: list[tuple[int, Any, Any]]) -> bool:
        """Take over served shards no live job holds, up to this job's share; True when it took any.
        `flags`: (shard, `queued` value, its PTTL) of the served shards not held, read by the look."""
        room = self._share() - len(self.held)
        mode = "adopt"
        taking: set[int] = set()
        if self.load.light:
            # Light: every served shard, free or held by a lingering job whose token sorts after ours.
            mode = "concentrate"
            room = len(self.linger.served) - len(self.held)
            token = self.linger.token.encode()
            taking = {s for s, v, _ in flags if v is not None and v != b"1" and v > token}
            free = [s for s, v, _ in flags if v is None or v == b"1" or s in taking]
        elif room <= 0:
            # Past its share, a job still takes one shard whose job has waited in the queue for
            # WAITING_ADOPT_SECONDS: every worker is lingering on its share (a SIGKILLed worker's
            # registration counts as live until it expires, or shards outnumber the workers), so that
            # job would wait for a lingering one to end, up to its idle time or its budget.
            waited = self.queued_ttl_ms - int(WAITING_ADOPT_SECONDS * 1000)
            free = [s for s, v, pttl in flags if v == b"1" and 0 < int(pttl) <= waited]
            room = 1
        else:
            free = [s for s, v, _ in flags if v is None or v == b"1"]
        if not free:
            return False
        first = min(self.held, default=0)
        free.sort(key=lambda s: (s - first) % max(1, max(self.linger.served) + 1))
        # The first `room` free shards in one pipeline; one another job took meanwhile (two jobs starting
        # together see the same free shards) is replaced by the next free one, a round trip each.
        got: list[int] = []
        tried = 0
        while len(got) < room and tried < len(free):
            batch = free[tried : tried + room - len(got)]
            tried += len(batch)
            pipe = self.redis.pipeline(transaction=False)
            for s in batch:
                self.flags.hold_in(pipe, s, self.linger.token, self.hold_ms, mode)
            replies = luapipe.execute(pipe, self.redis, [self.flags.hold_script], self.conn)
            got += [s for s, ok in zip(batch, replies, strict=True) if int(ok)]
        for s in got:
            self.held[s] = _Held(self.make(s))
        self.stats.taken_over += len(taking.intersection(got))
        if got:
            self.stats.adopted += len(got)
            log.debug("adopted shards %s", got)
        return bool(got)

    def _release_all(self, rearm: bool) -> None:
        if not self.held:
            return
        order = sorted(self.held)
        try:
            self.stats.requeued = self._let_go(order, rearm)
        except redis.RedisError:
            log.warning("could not release shards %s: their flags expire within a lease", order)
        finally:
            self.held.clear()

    def _let_go(self, shards: Sequence[int], rearm: bool) -> list[int]:
        """`RELEASE` `shards` in one pipeline; returns those re-armed (ids left): the caller enqueues."""
        pipe = self.redis.pipeline(transaction=False)
        for s in shards:
            self.flags.release_in(pipe, s, self.linger.token, self.queued_ttl_ms, rearm)
        flags = luapipe.execute(pipe, self.redis, [self.flags.release_script], self.conn)
        return [s for s, flag in zip(shards, flags, strict=True) if int(flag)]
