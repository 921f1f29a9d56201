"""`ipamgc bench --node-churn PRESET`: nodes joining and leaving as an autoscaler makes them, and how
long each collector takes to free what every deleted node held (projectcalico/calico#7839, #8643).

Why a module: the phase is the same for ipamgc's processes (`run.ModeRun`) and Calico's binary
(`calico.CalicoRun`); only reading the cost differs, and the caller passes that in.  The workload is
`lab.cluster.nodechurn` (its presets say what is compressed, and by how much); this module measures it:
- per deleted node, from its Node object's deletion: when its last IP was freed (the ground truth), when
  its last block stopped being affine to it (deleted, or its affinity cleared), when its last
  BlockAffinity went (both seen on the simulated API server's commits); p50 / p99 / max over the nodes,
  for drained and abruptly terminated nodes apart (an abrupt node's pods stay until the pod GC,
  `pod_gc_after` after the deletion: no collector may free them before);
- what the deleted nodes still hold, every second: blocks, affinities, IPs (peak, end, a series);
- what the pool's exhaustion cost the CNI: IPs borrowed from other nodes' blocks, assignments refused;
- the CPU of the whole phase (the churn, then the wait for the last deleted node to be freed, at most
  `SETTLE_SECONDS`), per node replaced.
On a real kube-apiserver (`--kube-apiserver`) the blocks are followed by the actors' watch and the
affinities listed every second (the simulated server's commits are seen as they happen).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from lab.apiserver.store import Store
from lab.bench import measure
from lab.bench.config import BenchConfig
from lab.cluster.cluster import SimCluster
from lab.cluster.nodechurn import PRESETS, NodeChurn, NodeChurnPlan, affine_node, held_ips
from lab.cluster.truth import Usage as Life

# After the last replacement (and the pod GC of the last abrupt node): how long the phase waits for every
# deleted node to be freed.  ipamgc's promise is the grace period + 30 s (a deleted node's IPs need no
# grace); the wait is longer so that a slower collector is measured, not cut off.
SETTLE_SECONDS = 90.0
SAMPLE_SECONDS = 1.0
SERIES_EVERY = 10  # samples: one point of the reported series every 10 s


class Phased(Protocol):
    cfg: BenchConfig
    sim: SimCluster
    result: dict[str, Any]

    def say(self, line: str) -> None: ...
    def wait(self, what: str, pred: Callable[[], bool], timeout: float | None = None) -> bool: ...
    def start_phase(self) -> measure.Reading: ...
    def reading(self) -> measure.Reading: ...


def plan_of(cfg: BenchConfig) -> NodeChurnPlan:
    """The preset, scaled to the run's cluster when `--nodes`/`--pods-per-node` say otherwise."""
    return PRESETS[str(cfg.node_churn)].scaled(cfg.nodes, cfg.pods_per_node)


class NodeFreeing:
    """Which blocks and affinities each node holds, kept from the store's commits, and when each deleted
    node's last IP, block and affinity went."""

    def __init__(self, sim: SimCluster) -> None:
        self.sim = sim
        self._lock = threading.Lock()
        self.held: dict[str, dict[str, set[str]]] = {"ipamblocks": {}, "blockaffinities": {}}
        for plural, held in self.held.items():
            for obj in sim.store.list(plural)["items"]:
                node = affine_node(plural, obj)
                if node is not None:
                    held.setdefault(node, set()).add(obj["metadata"]["name"])
        self.deleted_at: dict[str, float] = {}
        self.abrupt: dict[str, bool] = {}
        self.ips: dict[str, list[Life]] = {}
        self.freed_at: dict[str, dict[str, float]] = {"ipamblocks": {}, "blockaffinities": {}}
        self.samples: list[tuple[float, int, int, int]] = []
        # The simulated API server calls a hook on every commit; a real one's `RestStore` only on IPAMBlock
        # changes (from its watch), so there the affinities are listed at each sample instead.
        self._list_affinities = not isinstance(sim.store, Store)
        sim.store.add_hook(self._on_commit)

    def close(self) -> None:
        remove = getattr(self.sim.store, "remove_hook", None)
        if remove is not None:
            remove(self._on_commit)

    def _relist_affinities(self) -> None:
        held: dict[str, set[str]] = {}
        for obj in self.sim.store.list("blockaffinities")["items"]:
            node = affine_node("blockaffinities", obj)
            if node is not None:
                held.setdefault(node, set()).add(obj["metadata"]["name"])
        now = time.time()
        with self._lock:
            self.held["blockaffinities"] = held
            for node in self.deleted_at:
                if not held.get(node):
                    self.freed_at["blockaffinities"].setdefault(node, now)

    def _on_commit(
        self, plural: str, event: str, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None
    ) -> None:
        held = self.held.get(plural)
        if held is None:
            return
        name = str((new or old or {}).get("metadata", {}).get("name", ""))
        before = affine_node(plural, old)
        after = None if event == "DELETED" else affine_node(plural, new)
        if before == after:
            return
        with self._lock:
            if after is not None:
                held.setdefault(after, set()).add(name)
            if before is not None:
                names = held.get(before, set())
                names.discard(name)
                if not names and before in self.deleted_at:
                    self.freed_at[plural].setdefault(before, time.time())

    def deleting(self, node: str, abrupt: bool) -> None:
        """Just before `node`'s Node object is deleted: its IPs now, and the clock starts."""
        ips = held_ips(self.sim, [node])[node]
        with self._lock:
            at = time.time()
            self.deleted_at[node] = at
            self.abrupt[node] = abrupt
            self.ips[node] = ips
            for plural, held in self.held.items():
                if not held.get(node):
                    self.freed_at[plural][node] = at

    def _ips_freed_at(self, node: str) -> float | None:
        lives = self.ips.get(node, [])
        if any(life.freed_at is None for life in lives):
            return None
        return max((life.freed_at or 0.0 for life in lives), default=self.deleted_at[node])

    def all_freed(self) -> bool:
        with self._lock:
            nodes = list(self.deleted_at)
            return all(
                self._ips_freed_at(n) is not None and all(n in f for f in self.freed_at.values())
                for n in nodes
            )

    def sample(self) -> None:
        if self._list_affinities:
            self._relist_affinities()
        with self._lock:
            deleted = list(self.deleted_at)
            blocks = sum(len(self.held["ipamblocks"].get(n, ())) for n in deleted)
            affinities = sum(len(self.held["blockaffinities"].get(n, ())) for n in deleted)
            ips = sum(1 for n in deleted for life in self.ips[n] if life.freed_at is None)
            self.samples.append((time.time(), blocks, affinities, ips))

    def report(self, start: float) -> dict[str, Any]:
        with self._lock:
            per: dict[str, dict[str, float | None]] = {}
            for node, at in self.deleted_at.items():
                ips = self._ips_freed_at(node)
                blocks = self.freed_at["ipamblocks"].get(node)
                affinities = self.freed_at["blockaffinities"].get(node)
                every = [ips, blocks, affinities]
                per[node] = {
                    "ips": None if ips is None else max(0.0, ips - at),
                    "blocks": None if blocks is None else blocks - at,
                    "affinities": None if affinities is None else affinities - at,
                    "all": None if None in every else max(t or 0.0 for t in every) - at,
                }

            def pct(key: str, kind: bool | None = None) -> dict[str, Any]:
                values = [
                    v[key]
                    for n, v in per.items()
                    if v[key] is not None and (kind is None or self.abrupt[n] is kind)
                ]
                return measure.percentiles([float(x) for x in values if x is not None])

            never = [n for n, v in per.items() if v["all"] is None]
            samples = self.samples
            peak = [max((s[i] for s in samples), default=0) for i in (1, 2, 3)]
            end = list(samples[-1][1:]) if samples else [0, 0, 0]
            return {
                "nodes_deleted": len(per),
                "freed_after_deletion_seconds": {
                    "ips": pct("ips"),
                    "blocks": pct("blocks"),
                    "affinities": pct("affinities"),
                    "all": pct("all"),
                    "all_drained": pct("all", False),
                    "all_abrupt": pct("all", True),
                },
                "never_freed": {
                    "nodes": len(never),
                    "ips": sum(1 for n in never for life in self.ips[n] if life.freed_at is None),
                    "blocks": sum(len(self.held["ipamblocks"].get(n, ())) for n in never),
                    "affinities": sum(len(self.held["blockaffinities"].get(n, ())) for n in never),
                },
                "held_by_deleted_nodes": {
                    "peak": dict(zip(("blocks", "affinities", "ips"), peak, strict=True)),
                    "end": dict(zip(("blocks", "affinities", "ips"), end, strict=True)),
                    "series": [
                        [round(s[0] - start, 1), *s[1:]]
                        for i, s in enumerate(samples)
                        if i % SERIES_EVERY == 0 or i == len(samples) - 1
                    ],
                },
            }


def run_phase(
    run: Phased,
    before: Callable[[], None],
    cost: Callable[[measure.Reading, measure.Reading, int], dict[str, Any]],
) -> None:
    """The node-churn phase of `run` (either collector): `before` brings the collector to rest
    (unmeasured), `cost(start, end, events)` reads the phase's cost; the result is the run's
    `phases.node_churn`."""
    cfg, sim = run.cfg, run.sim
    plan = plan_of(cfg)
    before()
    run.say(
        f"node churn {plan.name}: {plan.replaced} of {len(sim.node_names)} nodes every {plan.period:g} s, "
        f"{100 * plan.abrupt:g} % abrupt, {cfg.node_churn_periods:g} periods"
    )
    freeing = NodeFreeing(sim)
    stop = threading.Event()

    def sampling() -> None:
        while not stop.wait(SAMPLE_SECONDS):
            freeing.sample()

    sampler = threading.Thread(target=sampling, name="node-churn-sampler", daemon=True)
    cni = sim.cni
    borrowed, refused = cni.borrowed, cni.refused
    try:
        start = run.start_phase()
        sampler.start()
        stats = NodeChurn(sim, plan, seed=cfg.seed, deleting=freeing.deleting).run(cfg.node_churn_periods)
        churned = time.monotonic() - start.monotonic
        settled = run.wait("every deleted node to be freed", freeing.all_freed, SETTLE_SECONDS)
        end = run.reading()
        stop.set()
        sampler.join()
        freeing.sample()
    finally:
        stop.set()
        freeing.close()
    phase = cost(start, end, stats.joined)
    phase["events_are"] = "nodes replaced"
    phase.update(freeing.report(start.wall))
    phase["plan"] = plan.as_dict()
    phase["periods"] = cfg.node_churn_periods
    phase["workload"] = stats.as_dict()
    phase["churn_seconds"] = round(churned, 3)
    phase["all_freed"] = settled
    phase["cni"] = {"borrowed_ips": cni.borrowed - borrowed, "refused_assignments": cni.refused - refused}
    run.result["phases"]["node_churn"] = phase
    freed = phase["freed_after_deletion_seconds"]["all"]
    run.say(
        f"  {stats.joined} nodes replaced, all freed p50 {freed['p50']} s p99 {freed['p99']} s max "
        f"{freed['max']} s, never freed {phase['never_freed']['nodes']}, "
        f"{phase['cpu_seconds']['total']} CPU s, refused {phase['cni']['refused_assignments']}"
    )


def table_lines(report: Mapping[str, Any]) -> list[str]:
    """The table's node-churn section: per mode, seconds from a Node's deletion to all it held freed."""
    rows = [
        (mode, m["phases"]["node_churn"])
        for mode, m in report["modes"].items()
        if isinstance(m, Mapping) and "node_churn" in (m.get("phases") or {})
    ]
    if not rows:
        return []

    def pct(p: Mapping[str, Any]) -> str:
        return "/".join("-" if p.get(k) is None else f"{p[k]:g}" for k in ("p50", "p99", "max"))

    lines = [
        "",
        "node churn: seconds from a Node's deletion to its last IP, block and affinity freed (p50/p99/max)",
        f"{'mode':<12} {'all':>18} {'drained':>18} {'abrupt':>18} {'never':>6} {'peak blk/IP':>12} "
        f"{'borrow/refused':>15} {'CPU s':>7} {'ms/node':>8}",
    ]
    for mode, p in rows:
        freed = p["freed_after_deletion_seconds"]
        peak = p["held_by_deleted_nodes"]["peak"]
        cni = p["cni"]
        per_node = p.get("cpu_per_event_us", {}).get("total")
        lines.append(
            f"{mode:<12} {pct(freed['all']):>18} {pct(freed['all_drained']):>18} "
            f"{pct(freed['all_abrupt']):>18} {p['never_freed']['nodes']:>6} "
            f"{peak['blocks']:>5}/{peak['ips']:<6} "
            f"{cni['borrowed_ips']:>7}/{cni['refused_assignments']:<7} {p['cpu_seconds']['total']:>7.3g} "
            f"{'-' if per_node is None else f'{per_node / 1000:.1f}':>8}"
        )
    return lines
