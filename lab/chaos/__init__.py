"""Chaos runs: the real watcher, workers and leaders as processes, faults injected, judged on ground truth.

A run builds a simulated cluster in this process (`SimApiServer` + `SimCluster`, so the ground truth is at
hand), starts a redis-server of its own (so it may kill it and bring it back empty on the same port) and
every component as `ipamgc up` does (`running_stack`: one watcher, N workers, two leaders), drives pod
churn with leaks, and injects a seeded schedule of faults:

- `kill-watcher`, `kill-worker` (caught through Redis MONITOR in a shard job: holding a leased batch, or
  between two batches), `kill-leader` (on one of its release requests: the live re-check, the block read,
  the block write, the handle write): SIGKILL, then the supervisor restarts the process;
- `redis-restart`: the redis-server is killed and started again, empty, on the same port;
- `redis-rollback`: Redis goes back 1–4 s in one transaction (every key as it was): what a Sentinel
  failover to a replica that missed the last writes, or a restart from an older AOF, leaves; every
  writer's writes of those seconds (the watcher's, the workers', the leader's, RQ's) are lost;
- opt-in (`--faults`): `redis-failover` (`SENTINEL FAILOVER`), `redis-failover-lossy` (the replica cut
  off for 1–3 s of writes, then the master killed: the replica promoted without them) — the run's Redis is
  then a master, a replica and three sentinels on loopback (`lab.chaos.redisha`) and every client is
  given the `redis+sentinel://` URL —, and `redis-maxmemory` (maxmemory below the used memory,
  `noeviction`, for 2–4 s: every write refused with OOM), `redis-flushall` (every key gone at once, the
  server still up), and `node-churn` (a third of the nodes replaced
  over 40 % of the run, half of them terminated abruptly: `lab.chaos.nodechurn`);
- `api-errors` (500, 429 with Retry-After, 503 at seeded rates on every verb), `latency`,
  `drop-watches` (open watches cut, and a per-event drop rate), `expire-410` (history compacted and
  watches cut, and a rule answering 410 to the next watch or list continue), `conflict-storm` (a
  concurrent writer bumping the blocks that hold leaks: the leader's conditional writes get 409s);
- `stale-leader`: two leaders during a partition.  While the active leader is in the middle of a
  release its Lease is handed to the standby (`takeover`: the old leader still believes it leads, so its
  writes meet the epoch fence) or the process is frozen (`pause`: SIGSTOP until the standby leads with a
  newer epoch, then SIGCONT).

Then the faults heal (rules cleared, churn stopped, every component running) and the run is judged:
no IP in use was ever released (`truth.violations == []`), no unknown IP was freed, every leak is
released within grace + `settle_seconds` of the heal, blocks, handles and affinities agree
(`shared.consistency`; tolerated only where the API or a kill interrupted a leader's multi-step write, as
Calico's library would leave it: a handle still counting IPs its block released — the safe direction —,
or an affinity left `pendingDeletion` that the leader's next pass completes),
a stale leader made no IPAM write, and every node the node churn deleted holds nothing within grace +
`settle_seconds` of the heal: its IPs released, no block affine to it, no BlockAffinity of it
(`lab.chaos.nodes`).  The schedule is a pure function of the options and the seed:
`python -m lab.chaos --seed N` replays it (process timing still varies).

May import: the simulated cluster (`lab.apiserver`, `lab.cluster`) and the product it judges: its
runtime (`ipamgc.stack`, `ipamgc.supervisor`, `ipamgc.local_redis`), and what it reads of the
components' Redis (`shared`, the leader's audit stream: `workers.leader.audit`).
"""

from lab.chaos.redisproc import RedisProcess, Tls, free_port
from lab.chaos.report import ChaosReport
from lab.chaos.runner import ChaosRun, main, render_totals, run_chaos
from lab.chaos.schedule import COMPONENT_ENV, FAULT_KINDS, ChaosOptions, Fault, schedule

__all__ = [
    "COMPONENT_ENV",
    "FAULT_KINDS",
    "ChaosOptions",
    "ChaosReport",
    "ChaosRun",
    "Fault",
    "RedisProcess",
    "Tls",
    "free_port",
    "main",
    "render_totals",
    "run_chaos",
    "schedule",
]
