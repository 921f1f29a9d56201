"""The measured processes of a benchmark run, and what the kernel says they cost.

Why a module of its own: the benchmark is only as good as where its numbers come from.  Every ipamgc
component runs as its own OS process (`python -m ipamgc.commands.watch|work|lead`, what a container runs),
and so does `redis-server`; their CPU and memory are read from the kernel, never estimated:
- CPU: the exact nanoseconds each thread ran (`/proc/<pid>/task/<tid>/schedstat`), summed per process
  over a phase (`cpu_delta`); where a thread ended or a reaped child was counted between the two readings
  (their time is in no live thread's schedstat), `/proc/<pid>/stat` utime + stime + cutime + cstime in
  clock ticks instead.  Ticks alone resolve 10 ms per process and reading: ±0.5 ms/s per process over a
  20 s idle phase, as much as the whole system's idle target;
- memory: `VmHWM` (peak resident set) from `/proc/<pid>/status`; writing `5` to `/proc/<pid>/clear_refs`
  resets it, so each phase reports its own peak (where the kernel refuses, the peak is since start, an
  upper bound).
The simulated API server lives in the benchmark's own process and is never counted.

`Fleet` starts the processes with their output in log files, and always stops them: SIGTERM, then SIGKILL
after a grace period, and every child is reaped; should the benchmark die first, they die with it
(`ipamgc.childproc`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ipamgc import childproc
from ipamgc.local_redis import SERVER_ARGS, redis_server_binary

TICK = os.sysconf("SC_CLK_TCK")
MIB = 1024 * 1024
# How process CPU and memory are grouped in reports; `combined`: `ipamgc combined`'s one process.
ROLES = ("watcher", "workers", "leader", "redis", "combined")


@dataclass(frozen=True, slots=True)
class CpuSample:
    """A process's CPU at one instant: `ticks` (seconds of utime + stime + cutime + cstime, 10 ms
    steps), `children` (seconds of cutime + cstime) and `threads` (tid → nanoseconds run, exact)."""

    ticks: float
    children: float = 0.0
    threads: Mapping[int, int] = field(default_factory=dict)


def cpu_sample(pid: int) -> CpuSample:
    """`pid`'s CPU now (all zero once the process is gone)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
        tids = os.listdir(f"/proc/{pid}/task")
    except (FileNotFoundError, ProcessLookupError):
        return CpuSample(0.0)
    fields = text.rsplit(")", 1)[1].split()  # the command name may hold spaces and parentheses
    # A thread that ended meanwhile (or no schedstat here) is left out: `cpu_delta` falls back.
    runs = {int(tid): _thread_ns(pid, tid) for tid in tids}
    threads = {tid: ns for tid, ns in runs.items() if ns is not None}
    return CpuSample(
        sum(int(f) for f in fields[11:15]) / TICK, sum(int(f) for f in fields[13:15]) / TICK, threads
    )


def cpu_delta(start: CpuSample, end: CpuSample) -> tuple[float, bool]:
    """CPU seconds between two samples of one process, and whether exact: the threads' nanoseconds when
    every thread of `start` is still in `end` and no child was reaped between (a thread started between
    counts whole: all of its time is inside), else the ticks."""
    exact = (
        bool(end.threads)
        and end.children == start.children
        and all(tid in end.threads and end.threads[tid] >= ns for tid, ns in start.threads.items())
    )
    if exact:
        return sum(ns - start.threads.get(tid, 0) for tid, ns in end.threads.items()) / 1e9, True
    return max(0.0, end.ticks - start.ticks), False


def thread_cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds of `pid`'s live threads by OS name (`producer/threadname.py`), exact nanoseconds from
    each thread's `schedstat` rather than `stat`'s 10 ms ticks: `main` for the main thread, `other` for
    the threads left unnamed; {} once the process is gone."""
    out: dict[str, float] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except (FileNotFoundError, ProcessLookupError):
        return out
    main_comm = _process_comm(pid)
    for tid in tids:
        try:
            comm = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended meanwhile
        ns = _thread_ns(pid, tid)
        if ns is None:
            continue
        name = "main" if tid == str(pid) else comm if comm != main_comm else "other"
        out[name] = out.get(name, 0.0) + ns / 1e9
    return out


def _thread_ns(pid: int, tid: str) -> int | None:
    """Nanoseconds thread `tid` of `pid` has run (`schedstat`'s first field), None once it has ended."""
    try:
        return int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
    except (FileNotFoundError, ProcessLookupError, ValueError, IndexError):
        return None


def _process_comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def _status_kib(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def rss_bytes(pid: int) -> int:
    """Resident set (`VmRSS`) now; 0 once the process is gone."""
    return _status_kib(pid, "VmRSS") * 1024


def peak_rss_bytes(pid: int) -> int:
    """Peak resident set (`VmHWM`) since start or since the last `reset_peak_rss`."""
    return _status_kib(pid, "VmHWM") * 1024


def reset_peak_rss(pid: int) -> bool:
    """Restart the peak-RSS watermark at the current RSS; False where the kernel does not allow it."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def process_env(pid: int) -> dict[str, str]:
    """The environment `pid` was started with (`/proc/<pid>/environ`; empty once the process is gone).
    Read it after the process has exec'd: between fork and exec it is still its parent's."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {name.decode(errors="replace"): value.decode(errors="replace") for name, value in pairs}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Proc:
    """One started process: `name` is unique (`worker-1`), `role` groups it (`workers`)."""

    name: str
    role: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 20) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


@dataclass(frozen=True, slots=True)
class Usage:
    """CPU and peak RSS per process name, read at one instant."""

    cpu: Mapping[str, CpuSample]
    peak_rss: Mapping[str, int]


class Fleet:
    """The processes of one benchmark mode.  Use as a context manager: everything is stopped on exit."""

    def __init__(self, workdir: Path, python: str = sys.executable, cwd: Path | None = None) -> None:
        self.workdir = workdir
        self.python = python
        self.cwd = cwd
        self.procs: list[Proc] = []
        self._logs: list[object] = []
        # Each process's highest peak RSS over the readings taken (`usage`), bytes by name: a phase's
        # reading sees its peak since `reset_peaks`, so this is the process's peak over the run.
        self.highest: dict[str, int] = {}

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()

    def start(self, name: str, role: str, args: list[str], env: Mapping[str, str] | None = None) -> Proc:
        log = self.workdir / f"{name}.log"
        full_env = {**os.environ, **(env or {})}
        with log.open("wb") as out:
            popen = childproc.popen(
                args,
                cwd=self.cwd,
                env=full_env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        proc = Proc(name, role, popen, log)
        self.procs.append(proc)
        return proc

    def start_component(
        self, name: str, role: str, module: str, args: list[str], env: Mapping[str, str] | None = None
    ) -> Proc:
        """`python -m <module> <args>` (an ipamgc component, as its container runs it)."""
        return self.start(name, role, [self.python, "-m", module, *args], env)

    def start_redis(self, port: int) -> Proc:
        """A throw-away redis-server on loopback: no persistence, so that only ipamgc's work is measured."""
        args = [redis_server_binary(), "--bind", "127.0.0.1", "--port", str(port), "--save", ""]
        args += ["--appendonly", "no", "--dir", str(self.workdir), "--loglevel", "warning", *SERVER_ARGS]
        return self.start("redis", "redis", args)

    def by_role(self, role: str) -> list[Proc]:
        return [p for p in self.procs if p.role == role]

    def watchers(self) -> list[Proc]:
        """The processes the watcher runs in: its own, or `ipamgc combined`'s."""
        return self.by_role("watcher") or self.by_role("combined")

    def dead(self) -> list[Proc]:
        return [p for p in self.procs if not p.alive()]

    def usage(self) -> Usage:
        usage = Usage(
            cpu={p.name: cpu_sample(p.pid) for p in self.procs},
            peak_rss={p.name: peak_rss_bytes(p.pid) for p in self.procs},
        )
        for name, peak in usage.peak_rss.items():
            self.highest[name] = max(self.highest.get(name, 0), peak)
        return usage

    def reset_peaks(self) -> bool:
        return all([reset_peak_rss(p.pid) for p in self.procs])

    def stop(self, proc: Proc, timeout: float = 15.0) -> int | None:
        """SIGTERM, then SIGKILL after `timeout` seconds; always reaped.  Returns the exit status."""
        if proc.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.popen.send_signal(signal.SIGTERM)
        try:
            return proc.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.popen.kill()
            return proc.popen.wait(timeout=timeout)

    def stop_all(self) -> None:
        """Stop the ipamgc components first (they flush to Redis on the way out), Redis last."""
        components = [p for p in self.procs if p.role != "redis"]
        for p in components:  # all at once: they stop in parallel
            if p.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.popen.send_signal(signal.SIGTERM)
        for p in [*components, *self.by_role("redis")]:
            self.stop(p)

    def __iter__(self) -> Iterator[Proc]:
        return iter(self.procs)


def record_peak_rss(result: dict[str, Any], fleet: Fleet) -> None:
    """`result["peak_rss_mib_all"]`, the mode's memory over its run (`peak_rss_all`), with this fleet's
    figures merged in (Calico's binary runs twice, one fleet after the other)."""
    result["peak_rss_mib_all"] = peak_rss_all(fleet.highest, result.get("peak_rss_mib_all"))


def peak_rss_all(highest: Mapping[str, int], before: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A mode's memory over its run: each process's highest peak RSS (MiB, by name) and their sum, what
    its processes held at most together if their peaks coincided.  `before`: the figures of an earlier
    fleet of the same mode, which ran before this one: the larger sum stands, each process keeps its own."""
    by = {name: round(b / MIB, 1) for name, b in highest.items()}
    total = round(sum(by.values()), 1)
    if before:
        by = {**before["by_process"], **{n: max(v, before["by_process"].get(n, 0.0)) for n, v in by.items()}}
        total = max(total, before["sum"])
    return {"sum": total, "by_process": dict(sorted(by.items()))}


def grouped(values: Mapping[str, float], fleet: Fleet) -> dict[str, float]:
    """Per-process values summed per role (`worker-0` + `worker-1` → `workers`)."""
    out: dict[str, float] = {}
    for p in fleet:
        out[p.role] = out.get(p.role, 0.0) + values.get(p.name, 0.0)
    return out


def grouped_max(values: Mapping[str, int], fleet: Fleet) -> dict[str, int]:
    """The largest per-process value per role (peak RSS of the biggest worker, not a sum)."""
    out: dict[str, int] = {}
    for p in fleet:
        out[p.role] = max(out.get(p.role, 0), values.get(p.name, 0))
    return out
