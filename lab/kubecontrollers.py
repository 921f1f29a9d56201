"""Calico's own kube-controllers, run beside ipamgc as the yardstick: the binary, its environment, its log.

Why a module of its own: `ipamgc bench --mode calico` and `ipamgc compare` both run the real Go binary
of `calico-kube-controllers` against a simulated cluster, and they must run it the same way, the way a
Calico cluster does: only the node controller (`ENABLED_CONTROLLERS=node`), the Kubernetes datastore,
one process (`CALICO_KUBE_CONTROLLERS_INNER=1`: no supervising parent, whose CPU would go unmeasured), and
`KubeControllersConfiguration/default` as a running Calico cluster holds it (`kcc_spec`).  ipamgc never
builds or ships that binary: the user gives its path (`--calico-kube-controllers`, or
`$IPAMGC_CALICO_KUBE_CONTROLLERS`), e.g. copied out of Calico's published image (`HOW_TO_GET`).

What is read of the binary is what an operator sees: its CPU and memory from the kernel (the benchmark's
`procs`), its requests from the simulated API server's request log, and its own log lines at `info`
(`CalicoLog`: a candidate, a confirmed leak, a release), never anything inside the process.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ENV_VAR",
    "HOW_TO_GET",
    "Binary",
    "CalicoLog",
    "environment",
    "kcc_spec",
    "parse_binaries",
]

ENV_VAR = "IPAMGC_CALICO_KUBE_CONTROLLERS"
HOW_TO_GET = (
    "no Calico kube-controllers binary: give --calico-kube-controllers PATH (or NAME=PATH,NAME=PATH for "
    f"several versions, or set ${ENV_VAR}); copy it out of Calico's image, e.g. "
    "`docker create --name kc calico/kube-controllers:v3.33.0 && docker cp kc:/usr/bin/kube-controllers . "
    "&& docker rm kc`"
)


@dataclass(frozen=True, slots=True)
class Binary:
    """One kube-controllers binary: `mode` names its benchmark mode (`calico`, or `calico-<NAME>` when
    several are given), `name` the version label the user gave (or `calico`)."""

    name: str
    path: Path

    @property
    def mode(self) -> str:
        return "calico" if self.name == "calico" else f"calico-{self.name}"


_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def parse_binaries(text: str | None) -> tuple[Binary, ...]:
    """`--calico-kube-controllers`: `PATH`, or `NAME=PATH,NAME=PATH` (e.g. `v3.33=/opt/kc-3.33`).  Each
    path must be an executable file; a bad value raises ValueError with one line saying why."""
    if text is None or not text.strip():
        return ()
    out: list[Binary] = []
    parts = [p.strip() for p in text.split(",") if p.strip()]
    for part in parts:
        name, sep, raw = part.partition("=")
        if not sep:
            if len(parts) > 1:
                raise ValueError(f"{part!r}: give NAME=PATH for each of several kube-controllers binaries")
            name, raw = "calico", part
        elif not _NAME.match(name):
            raise ValueError(f"{name!r}: a kube-controllers name is letters, digits, '.', '_' and '-'")
        path = Path(raw).expanduser()
        if not path.is_file():
            raise ValueError(f"{raw}: no such file (the calico-kube-controllers binary)")
        if not os.access(path, os.X_OK):
            raise ValueError(f"{raw}: not executable (chmod +x it)")
        out.append(Binary(name, path.resolve()))
    if len({b.name for b in out}) != len(out):
        raise ValueError("each kube-controllers binary needs a name of its own")
    return tuple(out)


def environment(kubeconfig: Path, log_level: str = "info") -> dict[str, str]:
    """The environment a Calico cluster gives kube-controllers, for the node controller alone."""
    return {
        "KUBECONFIG": str(kubeconfig),
        "DATASTORE_TYPE": "kubernetes",
        "ENABLED_CONTROLLERS": "node",
        # One process: without it the binary re-executes itself under a supervising parent.
        "CALICO_KUBE_CONTROLLERS_INNER": "1",
        "LOG_LEVEL": log_level,
    }


def kcc_spec(leak_grace_period: str, debug_profile_port: int | None = None) -> dict[str, Any]:
    """`KubeControllersConfiguration/default`'s spec as a running Calico cluster holds it.

    - Every field kube-controllers defaults is written out: 3.26 writes its defaults back into the spec
      on its first start (`prometheusMetricsPort`), sees that as a configuration change and exits to be
      restarted (`configuration changed; restarting`), as a pod does once on a new cluster;
    - `prometheusMetricsPort: 0`: no metrics listener (nothing scrapes it here, and two runs on one host
      would collide on 9094);
    - `leakGracePeriod` explicit (the IPAM garbage collector is off without one in some versions);
    - `controllers.migration.policyNameMigrator: Disabled`: otherwise 3.33's data feed waits for a
      calico-node DaemonSet, which a simulated cluster has not, and its IPAM GC never runs;
    - `debugProfilePort`: Go's pprof on loopback, when profiling."""
    spec: dict[str, Any] = {
        "logSeverityScreen": "Info",
        "healthChecks": "Enabled",
        "etcdV3CompactionPeriod": "10m0s",
        "prometheusMetricsPort": 0,
        "controllers": {
            "node": {
                "reconcilerPeriod": "5m0s",
                "syncLabels": "Enabled",
                "leakGracePeriod": leak_grace_period,
            },
            "migration": {"policyNameMigrator": "Disabled"},
        },
    }
    if debug_profile_port is not None:
        spec["debugProfilePort"] = debug_profile_port
    return spec


# Calico's info-level lines about IPAM (kube-controllers/pkg/controllers/node: ipam.go, ipam_allocation.go;
# the same words in 3.26 and 3.33).
_FIELD = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')
_EVENTS = {
    "Candidate IP leak": "candidate",
    "Confirmed IP leak": "confirmed",
    "Successfully garbage collected leaked IP address": "released",
    "Leaked IP has been resurrected": "resurrected",
    "Syncer is InSync": "in-sync",
    "configuration changed; restarting": "restarting",
    "Releasing affinity for empty block": "empty-block",
    # 3.33's checkAllocations, at each full scan (its ticker every grace / 2, a node deletion, the first
    # sync); read from release-v3.33's ipam.go only (the backstop phase counts these).
    "Performing a full scan of IPAM allocations": "full-scan",
}


@dataclass(frozen=True, slots=True)
class LogEvent:
    kind: str  # a value of `_EVENTS`
    fields: Mapping[str, str]  # ip, handle, node, pod, ... as Calico logged them


class CalicoLog:
    """kube-controllers' log file, read incrementally: the IPAM events it has logged so far."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""
        self.events: list[LogEvent] = []

    def poll(self) -> list[LogEvent]:
        """The events logged since the last poll (also appended to `events`)."""
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()
        new: list[LogEvent] = []
        for raw in lines:
            line = raw.decode(errors="replace")
            for text, kind in _EVENTS.items():
                if text in line:
                    fields = {k: v.strip('"') for k, v in _FIELD.findall(line.split(text, 1)[1])}
                    new.append(LogEvent(kind, fields))
                    break
        self.events.extend(new)
        return new

    def count(self, kind: str) -> int:
        self.poll()
        return sum(1 for e in self.events if e.kind == kind)

    def ips(self, kind: str) -> set[str]:
        """The IPs of every `kind` event so far (`candidate`, `confirmed`, `released`)."""
        self.poll()
        return {e.fields["ip"] for e in self.events if e.kind == kind and "ip" in e.fields}


@contextlib.contextmanager
def go_cpu_profile(port: int, out: Path, seconds: float) -> Iterator[None]:
    """Go's CPU profile of the binary (its KubeControllersConfiguration `debugProfilePort`, on loopback)
    over the block, written to `out` (nothing when the binary does not answer)."""
    url = f"http://127.0.0.1:{port}/debug/pprof/profile?seconds={max(1, round(seconds))}"

    def fetch() -> None:
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=seconds + 30) as resp:
            out.write_bytes(resp.read())

    thread = threading.Thread(target=fetch, daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join(timeout=seconds + 35)
