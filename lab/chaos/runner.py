"""One chaos run end to end (`ChaosRun`: the cluster, Redis and the components started, the schedule
driven, the faults healed, the run judged), and `python -m lab.chaos`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path

import redis

from ipamgc.commands.flags import rewrite
from ipamgc.stack import Stack, running_stack
from lab.apiserver.apiserver import SimApiServer
from lab.chaos.actions import FaultActions
from lab.chaos.hooks import ChurnDriver
from lab.chaos.judge import Judge
from lab.chaos.redisha import RedisHA
from lab.chaos.redisproc import RedisProcess
from lab.chaos.report import ChaosReport
from lab.chaos.schedule import (
    ALL_FAULT_KINDS,
    COMPONENT_ENV,
    FAULT_KINDS,
    OPT_IN_FAULTS,
    SENTINEL_FAULTS,
    ChaosOptions,
    schedule,
)
from lab.chaos.soak import (
    SOAK_DEFAULTS,
    SOAK_ENV,
    SOAK_WARMUP,
    SOAK_WINDOW,
    SoakSampler,
    SoakWindow,
    render_verdict,
    render_window,
    soak_schedule,
    soak_verdict,
)
from lab.chaos.state import RunState
from lab.cluster.churn import Churn
from lab.cluster.podshape import POD_SIZE_HELP, POD_SIZES, pod_size
from redisio.client import redis_client
from shared.keys import STATE_SYNCED

log = logging.getLogger(__name__)


class ChaosRun(RunState):
    """One run (see the package docstring).  `run()` returns the report; nothing is left running."""

    def __init__(self, opts: ChaosOptions) -> None:
        super().__init__(opts)
        self.actions = FaultActions(self)
        self.judge = Judge(self)

    def run(self) -> ChaosReport:
        opts = self.opts
        started = time.monotonic()
        self.note("start", f"seed {opts.seed}; replay: python -m lab.chaos --seed {opts.seed}")
        self.sim.bootstrap(f"{opts.grace}s")
        self.sim.bulk_populate(opts.nodes, opts.pods_per_node, dual_stack_every=5)
        # Look-alikes that must be kept whatever happens (#12257, #5044).
        self.sim.stale_node_attribute("chaos", "stale-node-attr", "node-00000", attr_node="node-00001")
        self.sim.dual_stack_single_status("chaos", "dual-single", "node-00000")
        # With a failover among the faults, a master, a replica and three sentinels, and every client
        # (the components', the run's own) on the Sentinel URL.
        redis_proc: RedisProcess | RedisHA = (
            RedisHA(self.log_dir / "redis", self.stop)
            if SENTINEL_FAULTS & set(opts.faults)
            else RedisProcess(self.log_dir / "redis.log")
        )
        redis_proc.start()
        server = SimApiServer(self.store, bookmark_interval=0.2)
        server.faults = self.faults
        try:
            with server, self._stack(redis_proc, server) as stack:
                self.stack = stack
                self.client = redis_client(redis_proc.url)
                try:
                    self._drive(server, redis_proc)
                finally:
                    self.stop.set()
                    self.client.close()
                    self.report.restarts = {
                        n: c.starts - 1 for n, c in stack.supervisor.components.items() if c.starts > 1
                    }
        finally:
            redis_proc.stop()
        self.report.elapsed = time.monotonic() - started
        return self.report

    @contextlib.contextmanager
    def _stack(self, redis_proc: RedisProcess | RedisHA, server: SimApiServer) -> Iterator[Stack]:
        kubeconfig = server.write_kubeconfig(self.log_dir / "kubeconfig")
        with running_stack(
            redis_url=redis_proc.url,
            kubeconfig=str(kubeconfig),
            workers=self.opts.workers,
            leak_grace_period=None,
            dry_run=False,
            log_dir=self.log_dir,
            sim_args=[],
            leaders=2,
            extra_env=SOAK_ENV if self.opts.soak else COMPONENT_ENV,
        ) as stack:
            yield stack

    def _drive(self, server: SimApiServer, redis_proc: RedisProcess | RedisHA) -> None:
        opts = self.opts
        assert self.client is not None
        client = self.client
        synced = self.wait_for(lambda: _safe(lambda: client.hget(self.keys.state, STATE_SYNCED) == b"1"), 60)
        if not synced:
            raise RuntimeError(f"the watcher never synced (logs in {self.log_dir})")
        self.note("synced")
        churn = ChurnDriver(Churn(self.sim, opts.churn, opts.leak_rate, seed=opts.seed), opts.churn)
        churn.start()
        plan = soak_schedule(opts) if opts.soak else schedule(opts)
        sampler = self._sampler(churn, redis_proc) if opts.soak else None
        ends: list[tuple[float, Callable[[], None]]] = []
        phase = time.monotonic()
        try:
            for f in plan:
                while time.monotonic() - phase < f.at and not self.stop.is_set():
                    self._end_due(ends, phase)
                    self.poll()
                    self.stop.wait(min(0.05, max(0.0, phase + f.at - time.monotonic())))
                for undo in self.actions.apply(f, server, redis_proc, churn):
                    ends.append((f.at + f.length, undo))
                if sampler is not None:
                    sampler.note_fault(f"{f.at:.0f}s {f.kind} {dict(f.params).get('name', '')}".strip())
            while time.monotonic() - phase < opts.duration and not self.stop.is_set():
                self._end_due(ends, phase)
                self.poll()
                self.stop.wait(0.05)
        finally:
            churn.stop()
            if sampler is not None:
                sampler.stop()
                self._judge_soak(sampler)
            for _, undo in ends:
                undo()
            self.faults.clear()
            self.faults.disarm()
        self.judge.heal_and_judge(server)

    def _sampler(self, churn: ChurnDriver, redis_proc: RedisProcess | RedisHA) -> SoakSampler:
        assert self.stack is not None and self.client is not None
        components = self.stack.supervisor.components
        truth = self.sim.truth

        def pids() -> dict[str, int | None]:
            out = {name: c.pid for name, c in components.items()}
            proc = getattr(redis_proc, "proc", None)
            out["redis"] = proc.pid if proc is not None and proc.poll() is None else None
            return out

        def released(since: float, until: float) -> list[float]:
            return [
                u.freed_at - u.in_use_until
                for u in truth.released_leaks()
                if u.freed_at and u.in_use_until and since <= u.freed_at < until
            ]

        window = SOAK_WINDOW / self.opts.soak_compress
        sampler = SoakSampler(pids, self.client, lambda: churn.churn.stats.events, released, window)
        sampler.start()
        return sampler

    def _judge_soak(self, sampler: SoakSampler) -> None:
        warmup = SOAK_WARMUP / self.opts.soak_compress
        self.report.soak_windows = [
            {**asdict(w), "cpu_per_event_us": round(w.cpu_per_event_us)} for w in sampler.windows
        ]
        self.report.soak_verdict = soak_verdict(sampler.windows, warmup, self.opts.soak_max_slope)
        self.note("soak", f"{len(sampler.windows)} windows; {self.report.soak_verdict}")

    def _end_due(self, ends: list[tuple[float, Callable[[], None]]], phase: float) -> None:
        now = time.monotonic() - phase
        for item in [e for e in ends if e[0] <= now]:
            ends.remove(item)
            item[1]()


def _safe(read: Callable[[], bool]) -> bool:
    try:
        return read()
    except redis.RedisError:
        return False


def run_chaos(opts: ChaosOptions) -> ChaosReport:
    return ChaosRun(opts).run()


def parse_duration(text: str) -> float:
    """Seconds from `90`, `90s`, `10m` or `2h`."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0}
    try:
        value = float(text[:-1]) * units[text[-1]] if text and text[-1] in units else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (seconds, or 90s, 10m, 2h)") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"a duration must be positive: {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The runner's options (`ipamgc chaos -h`); `--json` is `--output-file`'s old spelling.  Options left
    unset take the soak's defaults with `--soak` (`SOAK_DEFAULTS`), the chaos run's otherwise."""
    defaults = ChaosOptions()
    parser = argparse.ArgumentParser(prog="ipamgc chaos", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=int(os.environ.get("IPAMGC_CHAOS_SEED", "0")))
    parser.add_argument("--runs", type=int, default=1, help="runs with seeds seed, seed+1, …")
    parser.add_argument(
        "--duration",
        type=parse_duration,
        default=None,
        help=f"seconds of faults, or 10m, 2h (default {defaults.duration:g}; with --soak "
        f"{SOAK_DEFAULTS['duration'] / 3600:g}h)",
    )
    parser.add_argument("--nodes", type=int, default=None, help=f"default {defaults.nodes} (--soak 500)")
    parser.add_argument(
        "--pods-per-node", type=int, default=None, help=f"default {defaults.pods_per_node} (--soak 100)"
    )
    parser.add_argument(
        "--churn", type=float, default=None, help=f"pod events/s (default {defaults.churn:g}; --soak 20)"
    )
    parser.add_argument("--workers", type=int, default=defaults.workers)
    parser.add_argument(
        "--faults",
        default=",".join(FAULT_KINDS),
        help=f"comma-separated fault kinds (default: all but the opt-in {', '.join(OPT_IN_FAULTS)}; "
        f"known: {', '.join(ALL_FAULT_KINDS)}); ignored by --soak",
    )
    parser.add_argument(
        "--pod-size", choices=POD_SIZES, default=None, help=POD_SIZE_HELP + " (default small; --soak real)"
    )
    parser.add_argument(
        "--soak",
        action="store_true",
        help="a soak: a node lost every 10 min, the leader killed every 20, Redis restarted every 30; "
        "RSS, CPU, Redis keys and memory per 10-minute window, their growth judged after 20 min",
    )
    parser.add_argument(
        "--soak-compress",
        type=float,
        default=defaults.soak_compress,
        metavar="K",
        help="divide the soak's periods (faults, windows, warm-up) by K (the slow CI stage: 12)",
    )
    parser.add_argument(
        "--soak-max-slope",
        type=float,
        default=defaults.soak_max_slope,
        metavar="PCT",
        help="%% an hour a process's peak RSS, Redis's keys or memory may grow after the warm-up "
        f"(default {defaults.soak_max_slope:g})",
    )
    parser.add_argument(
        "--output-file",
        dest="json",
        type=Path,
        default=None,
        metavar="PATH",
        help="write the reports here (JSON)",
    )
    parser.add_argument("--log-dir", type=Path, default=None)
    return parser


RENAMED = {"--json": ("--output-file",)}  # old spellings, one release (`ipamgc.commands.flags`)


def options(args: argparse.Namespace, seed: int) -> ChaosOptions:
    """The options of one run from the command line (unset ones: the soak's defaults or the run's)."""
    base = asdict(ChaosOptions())
    if args.soak:
        base.update(SOAK_DEFAULTS)
    given = {
        "nodes": args.nodes,
        "pods_per_node": args.pods_per_node,
        "churn": args.churn,
        "duration": args.duration,
        "pod_size": args.pod_size,
    }
    base.update({k: v for k, v in given.items() if v is not None})
    if args.soak_compress <= 0:
        raise SystemExit("ipamgc chaos: --soak-compress must be positive")
    return ChaosOptions(
        seed=seed,
        nodes=base["nodes"],
        pods_per_node=base["pods_per_node"],
        churn=base["churn"],
        workers=args.workers,
        duration=base["duration"],
        settle_seconds=base["settle_seconds"],
        faults=tuple(k for k in args.faults.split(",") if k),
        log_dir=args.log_dir / f"seed-{seed}" if args.log_dir else None,
        pod_size=pod_size(base["pod_size"]),
        soak=args.soak,
        soak_compress=args.soak_compress,
        soak_max_slope=args.soak_max_slope,
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(rewrite("ipamgc chaos", sys.argv[1:] if argv is None else argv, RENAMED))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    reports = []
    for i in range(args.runs):
        report = run_chaos(options(args, args.seed + i))
        reports.append(report)
        print(report.summary(), flush=True)
        for window in report.soak_windows:
            fields = {k: v for k, v in window.items() if k != "cpu_per_event_us"}
            print(f"  {render_window(SoakWindow(**fields))}", flush=True)
        if report.soak_verdict:
            print(f"  soak: {render_verdict(report.soak_verdict)}", flush=True)
        for problem in report.problems():
            print(f"  FAIL {problem}", flush=True)
    print(render_totals(reports), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in reports], indent=2))
    return 0 if all(r.ok() for r in reports) else 1


def render_totals(reports: list[ChaosReport]) -> str:
    faults: Counter[str] = Counter()
    for r in reports:
        faults.update(r.faults)
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(faults.items()))
    return (
        f"{len(reports)} runs; faults injected {sum(faults.values())} ({kinds}); "
        f"leaks {sum(r.leaks_injected for r in reports)}, released {sum(r.leaks_released for r in reports)}, "
        f"outstanding {sum(len(r.leaks_outstanding) for r in reports)}; max latency "
        f"{max((r.max_latency for r in reports), default=0.0):.1f}s; last release after heal "
        f"{max((r.max_after_heal for r in reports), default=0.0):.1f}s; violations "
        f"{sum(len(r.violations) for r in reports)}; "
        + (
            f"deleted nodes {deleted}, freed {sum(r.nodes_freed for r in reports)} (max "
            f"{max(r.node_max_latency for r in reports):.1f}s after due); "
            if (deleted := sum(r.nodes_deleted for r in reports))
            else ""
        )
        + f"failed runs {sum(not r.ok() for r in reports)}"
    )
