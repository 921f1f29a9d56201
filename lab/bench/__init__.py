"""`ipamgc bench`: does ipamgc's cost follow the rate of change, or the size of the cluster?

The benchmark of design.md ("The benchmark"): a simulated cluster, the real watcher, workers and leader as
separate processes, three phases (cold start, steady churn, node loss), the same seeded workload in
up to three modes, and the ratios between them:
- `incremental`: ipamgc as it ships;
- `per-node`: Calico 3.30–3.33's per-node dirty tracking (#9654: every allocation of each node an event
  touched is re-validated, a node deletion is a full scan, a candidate on a clean node waits for the
  periodic full scan), what users of those versions compare ipamgc with;
- `full-scan`: every sync re-validates every allocation, as Calico 3.26 did (projectcalico/calico#7841);
- `calico`: Calico's own kube-controllers binary (a path the user gives), the real thing beside the two
  emulations above, which stay as algorithm baselines (`calico`: its cost run and latency run).

- `config`: the parameters (`BenchConfig`), the modes and the environment flags that make them;
- `procs`: the measured processes and the kernel's account of their CPU and memory;
- `probe`: the benchmark's questions to Redis, its own commands subtracted from the count;
- `harness`: starting and stopping the measured processes, each mode's environment, py-spy profiles;
- `observe`: the readings that bracket a phase, and waiting for the system to catch up;
- `run`: one mode end to end (`ModeRun`: the phases);
- `calico`: Calico's binary end to end (`CalicoRun`: the cost run; `calico_latency`: its short-grace run);
- `nodechurn`: the node-churn phase (`--node-churn`): when each deleted node's IPs, blocks went;
- `conflicts`: the conflicts phase (`--conflicts-seconds`): the CNI writing the leaks' blocks;
- `measure`: per-phase cost and latency arithmetic;
- `report`: ratios, targets, the table.

May import: the simulated cluster (`lab.apiserver`, `lab.cluster`), the real API server harness
(`lab.realapi`), Calico's binary (`lab.kubecontrollers`), and the product it measures: `shared`,
`ipamgc`'s process helpers; the components run as processes, except the handle collector's leader, run
in-process (`handles`: `workers.leader`, `producer.mirror`, `kubeio.election`).
"""

from __future__ import annotations

import compileall
import os
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lab.bench import backstop, calico_latency, report
from lab.bench.calico import run_calico
from lab.bench.config import CALICO, BenchConfig
from lab.bench.run import run_mode
from lab.kubecontrollers import HOW_TO_GET, Binary

__all__ = ["SOURCE_ROOT", "BenchConfig", "machine", "run_bench"]

# Where `python -m ipamgc.commands.…` finds ipamgc, producer, workers, redisio and shared (the source
# tree, or site-packages when installed): the components are started from here.
SOURCE_ROOT = Path(__file__).resolve().parents[2]
#: ipamgc's packages, byte-compiled before a run (`compile_sources`).
PACKAGES = ("shared", "redisio", "kubeio", "producer", "workers", "ipamgc", "lab")


def compile_sources(root: Path = SOURCE_ROOT) -> None:
    """Byte-compile ipamgc's packages under `root` before any component starts, as `pip install` does for
    the image (Dockerfile).  A checkout run with PYTHONDONTWRITEBYTECODE=1 (this project's machines, CI, a
    git worktree) otherwise compiles every module of ours from source in each process at each start:
    0.09-0.11 CPU s more for the watcher's and the leader's imports (measured), in every cold start.
    A tree that cannot be written keeps its processes compiling, as before."""
    for package in PACKAGES:
        if (root / package).is_dir():
            compileall.compile_dir(root / package, quiet=2)


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
    }


def run_bench(
    cfg: BenchConfig,
    *,
    command: str = "",
    progress: Callable[[str], None] = lambda _: None,
    compare: Any = None,
    cwd: Path | None = None,
    profile_dir: Path | None = None,
) -> dict[str, Any]:
    """Run every mode of `cfg` in turn and return the report (see `lab.bench.report.build`).  Only
    full-scan is skipped above `full_scan_max_pods`; per-node always runs."""
    modes: dict[str, Any] = {}
    compile_sources(cwd or SOURCE_ROOT)
    for mode in cfg.modes:
        if mode == CALICO:
            if not cfg.calico_binaries:
                modes[CALICO] = {"skipped": HOW_TO_GET}
                progress(f"{CALICO}: skipped ({HOW_TO_GET})")
                continue
            for name, path in cfg.calico_binaries:
                binary = Binary(name, Path(path))
                modes[binary.mode] = run_calico(
                    cfg,
                    binary,
                    progress,
                    profile_dir,
                    backstop=backstop.calico_passes,
                    latency=calico_latency.latency_run,
                )
            continue
        if mode == "full-scan" and cfg.pods > cfg.full_scan_max_pods:
            modes[mode] = {
                "skipped": f"{cfg.pods:,} pods is above --full-scan-max-pods {cfg.full_scan_max_pods:,}: "
                "re-validating every allocation on every batch would take the whole run"
            }
            progress(f"{mode}: skipped ({cfg.pods:,} pods > {cfg.full_scan_max_pods:,})")
            continue
        modes[mode] = run_mode(cfg, mode, progress, cwd or SOURCE_ROOT, profile_dir)
    config = cfg.as_dict()
    # The pods' mean size as served (the first ipamgc mode's cluster; every mode builds the same one).
    config["pod_json_bytes_mean"] = next(
        (m["pod_json_bytes_mean"] for m in modes.values() if m.get("pod_json_bytes_mean")), None
    )
    return report.build(config, modes, machine(), command, compare)
