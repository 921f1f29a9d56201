"""The soak (`ipamgc chaos --soak --duration 2h`): hours of pod churn with the faults a cluster sees on a
schedule — a node lost with its pods every 10 minutes, the leader killed mid-release every 20, Redis
restarted empty every 30 — and, per window (10 minutes), what each process costs and holds: peak RSS and
CPU of the watcher, every worker, both leaders and Redis, Redis's keys and memory, the pod events, the
leaks released and how fast.  After a warm-up (20 minutes) each series' slope is judged: a process whose
peak RSS grows by more than `max_slope` % an hour fails the run, as do Redis's keys and used memory (its
RSS is reported, not judged: Redis is a new process after each restart).

`--soak-compress K` divides every period (faults, windows, warm-up) by K: the 10-minute version of the
slow CI stage is `--duration 10m --soak-compress 12`.  The churn's rate is not compressed.
"""

from __future__ import annotations

import logging
import random
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from lab.bench.procs import cpu_sample, rss_bytes
from lab.chaos.schedule import LEADER_RELEASE_REQUESTS, LEASE_NAMESPACE, ChaosOptions, Fault

log = logging.getLogger(__name__)

# Seconds between two faults of a kind, and the first one's offset in its period (so that no two kinds
# land together): nodes lost at 5, 15, 25 … min, leader kills at 11, 31, 51 …, Redis restarts at 18, 48 ….
SOAK_PERIODS: dict[str, tuple[float, float]] = {
    "node-lost": (600.0, 300.0),
    "kill-leader": (1200.0, 660.0),
    "redis-restart": (1800.0, 1080.0),
}
SOAK_WINDOW = 600.0  # seconds a window of figures covers
SOAK_WARMUP = 1200.0  # seconds before the slopes are judged
SAMPLE_SECONDS = 2.0  # how often RSS and CPU are read (a peak between two reads is missed)
REDIS_DOWN_SECONDS = 0.5
# The soak's components run with the deployment's timings (the chaos runs' seconds-scale ones would make
# its CPU figures those of a system polling five times a second), in the run's Lease namespace.
SOAK_ENV = {"IPAMGC_ELECTION_NAMESPACE": LEASE_NAMESPACE, "IPAMGC_METRICS_PORT": "0"}
# The soak's defaults (issue 44): 50k real-size pods, 20 pod events a second, two hours.
SOAK_DEFAULTS: dict[str, Any] = {
    "nodes": 500,
    "pods_per_node": 100,
    "churn": 20.0,
    "pod_size": "real",
    "duration": 7200.0,
    "settle_seconds": 60.0,
}


def soak_schedule(opts: ChaosOptions) -> list[Fault]:
    """The soak's faults: each kind at its period ÷ `soak_compress`, none in the last window's tail."""
    k = opts.soak_compress
    g = opts.grace
    rng = random.Random(opts.seed)
    out: list[Fault] = []
    end = opts.duration - max(g + 5.0, 30.0 / k)
    for kind, (period, offset) in SOAK_PERIODS.items():
        t = offset / k
        while t < end:
            if kind == "node-lost":
                out.append(Fault(round(t, 2), "scenario", params=(("name", "node-lost"),)))
            elif kind == "redis-restart":
                out.append(Fault(round(t, 2), kind, 0.0, (("down", REDIS_DOWN_SECONDS),)))
            else:  # fuel (two leaks due one grace later), then the kill armed on a release request
                verb, resource = LEADER_RELEASE_REQUESTS[rng.randrange(len(LEADER_RELEASE_REQUESTS))]
                out.append(Fault(round(t, 2), "scenario", params=(("name", "fuel"),)))
                window = max(g + 5.0, 60.0 / k)
                params = (("verb", verb), ("resource", resource))
                out.append(Fault(round(t + g * 0.8, 2), kind, round(window, 2), params))
            t += period / k
    return sorted(out, key=lambda f: (f.at, f.kind))


@dataclass
class SoakWindow:
    """One window of the soak: `end` seconds into the fault phase."""

    end: float
    events: int = 0  # pod events the churn made
    cpu_seconds: dict[str, float] = field(default_factory=dict)  # by process (workers summed apart)
    rss_peak_mib: dict[str, float] = field(default_factory=dict)
    redis_keys: int = 0  # at the window's end
    redis_keys_peak: int = 0
    redis_used_mib: float = 0.0  # at the window's end
    redis_used_peak_mib: float = 0.0
    leaks_released: int = 0
    leak_latency_p50: float = 0.0
    leak_latency_p99: float = 0.0
    leak_latency_max: float = 0.0
    faults: list[str] = field(default_factory=list)

    @property
    def cpu_per_event_us(self) -> float:
        return 1e6 * sum(self.cpu_seconds.values()) / max(self.events, 1)


def slope_pct_per_hour(points: list[tuple[float, float]]) -> float:
    """The least-squares slope of (seconds, value) as a percentage of the mean value an hour."""
    if len(points) < 2:
        return 0.0
    xs = [x / 3600.0 for x, _ in points]
    ys = [y for _, y in points]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mean_x) ** 2 for x in xs)
    if var == 0 or mean_y == 0:
        return 0.0
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / var
    return round(100.0 * slope / mean_y, 2)


def _proc_stat(pid: int) -> tuple[float, float] | None:
    """CPU seconds (user + system, as `lab.bench.procs` reads them) and RSS in MiB of a live process,
    None if it is gone."""
    sample, rss = cpu_sample(pid), rss_bytes(pid)
    if not rss:
        return None
    return sample.ticks, rss / 2**20


class SoakSampler:
    """Reads every process's CPU and RSS and Redis's keys and memory every `SAMPLE_SECONDS`, closes a
    window every `window` seconds.  A restarted process's CPU is counted from its start; the CPU a dying
    process spent after its last read (at most a sample period) is not."""

    def __init__(
        self,
        pids: Callable[[], dict[str, int | None]],
        client: redis.Redis,
        events: Callable[[], int],
        released: Callable[[float, float], list[float]],
        window: float,
    ) -> None:
        self.pids = pids
        self.client = client
        self.events = events
        self.released = released  # leak latencies of the leaks released between two wall times
        self.window = window
        self.windows: list[SoakWindow] = []
        self.fault_notes: list[str] = []
        self._cpu_seen: dict[int, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-sampler", daemon=True)
        self._t0 = 0.0

    def note_fault(self, line: str) -> None:
        with self._lock:
            self.fault_notes.append(line)

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        current = SoakWindow(end=self.window)
        events_at = self.events()
        wall_at = time.time()
        for pid in self.pids().values():  # CPU spent before the soak is not the soak's
            if pid is not None and (read := _proc_stat(pid)) is not None:
                self._cpu_seen[pid] = read[0]
        while not self._stop.wait(SAMPLE_SECONDS):
            self._sample(current)
            elapsed = time.monotonic() - self._t0
            if elapsed >= current.end:
                events_at, wall_at = self._close(current, events_at, wall_at)
                current = SoakWindow(end=round(current.end + self.window, 2))
        if current.cpu_seconds and time.monotonic() - self._t0 >= current.end - self.window / 2:
            self._close(current, events_at, wall_at)  # a last window at least half long

    def _sample(self, w: SoakWindow) -> None:
        for comp, pid in self.pids().items():
            if pid is None or (read := _proc_stat(pid)) is None:
                continue
            cpu, rss = read
            name = "workers" if comp.startswith("worker-") else comp
            w.cpu_seconds[name] = w.cpu_seconds.get(name, 0.0) + cpu - self._cpu_seen.get(pid, 0.0)
            self._cpu_seen[pid] = cpu
            w.rss_peak_mib[comp] = max(w.rss_peak_mib.get(comp, 0.0), round(rss, 1))
        try:
            keys = int(self.client.dbsize())
            used = int(self.client.info("memory")["used_memory"]) / 2**20
        except redis.RedisError:
            return
        w.redis_keys, w.redis_used_mib = keys, round(used, 1)
        w.redis_keys_peak = max(w.redis_keys_peak, keys)
        w.redis_used_peak_mib = max(w.redis_used_peak_mib, round(used, 1))

    def _close(self, w: SoakWindow, events_at: int, wall_at: float) -> tuple[int, float]:
        events, wall = self.events(), time.time()
        w.events = events - events_at
        w.cpu_seconds = {k: round(v, 2) for k, v in sorted(w.cpu_seconds.items())}
        latencies = sorted(self.released(wall_at, wall))
        w.leaks_released = len(latencies)
        if latencies:
            w.leak_latency_p50 = round(latencies[len(latencies) // 2], 2)
            w.leak_latency_p99 = round(latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 2)
            w.leak_latency_max = round(latencies[-1], 2)
        with self._lock:
            w.faults, self.fault_notes = self.fault_notes, []
        self.windows.append(w)
        log.info("soak window %s", render_window(w))
        return events, wall


def render_window(w: SoakWindow) -> str:
    rss = sum(w.rss_peak_mib.values())
    return (
        f"{w.end / 60:.0f} min: {w.events} events, {w.cpu_per_event_us:.0f} µs CPU/event, RSS "
        f"{rss:.0f} MiB ({', '.join(f'{k} {v:.0f}' for k, v in sorted(w.rss_peak_mib.items()))}), Redis "
        f"{w.redis_keys} keys {w.redis_used_mib:.1f} MiB, leaks released {w.leaks_released} (p99 "
        f"{w.leak_latency_p99:.1f}s), faults {len(w.faults)}"
    )


def soak_verdict(windows: list[SoakWindow], warmup: float, max_slope: float) -> dict[str, Any]:
    """The slopes after the warm-up (% of the mean an hour) and the series that grew past `max_slope`."""
    after = [w for w in windows if w.end > warmup]
    names = sorted({k for w in after for k in w.rss_peak_mib})
    rss: dict[str, float] = {}
    for name in names:
        # A window where the process was not running at a read (between two lives) is left out.
        pts = [(w.end, w.rss_peak_mib[name]) for w in after if name in w.rss_peak_mib]
        rss[name] = slope_pct_per_hour(pts)
    rss_total = slope_pct_per_hour([(w.end, sum(w.rss_peak_mib.values())) for w in after])
    keys = slope_pct_per_hour([(w.end, float(w.redis_keys_peak)) for w in after])
    used = slope_pct_per_hour([(w.end, w.redis_used_peak_mib) for w in after])
    cpu = slope_pct_per_hour([(w.end, w.cpu_per_event_us) for w in after])
    # Redis is judged by what it holds (keys, used memory): its RSS is a restarted process's every 30 min.
    grew = [f"{n} peak RSS {s:+.2f} %/h" for n, s in rss.items() if s > max_slope and n != "redis"]
    grew += [f"Redis keys {keys:+.2f} %/h"] if keys > max_slope else []
    grew += [f"Redis used memory {used:+.2f} %/h"] if used > max_slope else []
    return {
        "windows_judged": len(after),
        "max_slope_pct_per_hour": max_slope,
        "rss_slope_pct_per_hour": rss,
        "rss_total_slope_pct_per_hour": rss_total,
        "redis_keys_slope_pct_per_hour": keys,
        "redis_used_slope_pct_per_hour": used,
        "cpu_per_event_slope_pct_per_hour": cpu,
        "grew": grew if len(after) >= 3 else [],
        "judged": len(after) >= 3,
    }


def render_verdict(v: dict[str, Any]) -> str:
    rss = ", ".join(f"{k} {s:+.2f}" for k, s in v["rss_slope_pct_per_hour"].items())
    judged = "judged" if v["judged"] else "not judged (fewer than 3 windows after the warm-up)"
    return (
        f"{v['windows_judged']} windows after the warm-up, {judged}; slopes in % an hour: peak RSS "
        f"{v['rss_total_slope_pct_per_hour']:+.2f} in all ({rss}), Redis keys "
        f"{v['redis_keys_slope_pct_per_hour']:+.2f}, Redis memory {v['redis_used_slope_pct_per_hour']:+.2f}, "
        f"CPU per event {v['cpu_per_event_slope_pct_per_hour']:+.2f} (limit {v['max_slope_pct_per_hour']:g} "
        "on RSS and Redis)"
    )
