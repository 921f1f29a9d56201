"""The README's first command, small: `ipamgc demo` releases every leak and no IP in use."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_demo_small_run_releases_every_leak_and_nothing_in_use(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ipamgc", "demo", "--nodes", "12", "--pods-per-node", "5", "--churn", "15",
         "--leak-rate", "0.3", "--leak-grace-period", "1s", "--duration", "8", "--json",
         "--log-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        timeout=120,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    result = json.loads(proc.stdout)
    assert result["in_use_released"] == 0
    assert result["leaks_injected"] >= 5  # churn leaks plus the node lost with its pods
    assert result["leaks_outstanding"] == 0
    assert result["leaks_released"] == result["leaks_injected"]
    assert set(result["cpu"]) == {"watcher", "worker-0", "worker-1", "leader"}
    assert len(result["scenarios"]) == 4
