"""The API server a benchmark run measures against: the simulated one (the default), or a real
kube-apiserver + etcd on loopback (`ipamgc bench --kube-apiserver DIR`).

Why a module of its own: every mode builds the same cluster (Calico's objects, the nodes, the pods and
their allocations, the ground truth) and reads the same few things back from its server (its URL, a
kubeconfig for the collector under measure, its objects, the API requests the collector made in a
phase).  `cluster()` builds it on either server and hands back a `Server` with those, so the modes do
not care which it is.

On the real server the actors (`SimCluster` and its bulk loader) write through `RestStore` as the
cluster admin; the collector, ipamgc's processes or Calico's kube-controllers, gets a token of its own
(`collector`, in `system:masters`), and its API requests are counted from kube-apiserver's audit log by
that identity.  Calico's CRDs are read from `IPAMGC_CALICO_CRDS` or `shared/calico-crds` beside the
checkout, as the realapi tier reads them.  The real server and etcd run beside the measured processes and
their CPU is not counted, as the simulated server's is not.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from lab.apiserver.apiserver import SimApiServer
from lab.apiserver.store import Store
from lab.cluster.cluster import SimCluster

__all__ = ["AuditRecord", "RealServer", "Server", "cluster"]

#: The identity the collector under measure runs as on a real server (`lab.realapi.identities`).
COLLECTOR = "collector"


class Server(Protocol):
    """What a benchmark run reads of its API server."""

    @property
    def url(self) -> str: ...

    @property
    def requests(self) -> list[Any]: ...  # records with .timestamp, .verb, .resource, .subresource

    @property
    def store(self) -> Any: ...  # get / list / replace, as `Store` and `RestStore` have them

    def write_kubeconfig(self, path: Path) -> Path: ...


@dataclass(frozen=True)
class AuditRecord:
    """One request of the collector, from kube-apiserver's audit log (what `RequestRecord` is for the
    simulated server's request log)."""

    timestamp: float
    verb: str
    resource: str | None
    subresource: str | None


class RealServer:
    """A running `lab.realapi.RealCluster` as a benchmark run reads it."""

    def __init__(self, real: Any, store: Any) -> None:
        self.real = real
        self._store = store
        self._offset = 0
        self._records: list[AuditRecord] = []

    @property
    def url(self) -> str:
        return str(self.real.url)

    @property
    def store(self) -> Any:
        return self._store

    def write_kubeconfig(self, path: Path) -> Path:
        shutil.copyfile(self.real.kubeconfig(COLLECTOR), path)
        return path

    @property
    def requests(self) -> list[AuditRecord]:
        """The collector's requests so far (the audit log read on from where the last call stopped)."""
        with contextlib.suppress(FileNotFoundError), self.real.audit_log.open("rb") as f:
            f.seek(self._offset)
            while True:
                line = f.readline()
                if not line.endswith(b"\n"):
                    break  # a line still being written: read it next time
                self._offset += len(line)
                record = _audit_record(line)
                if record is not None:
                    self._records.append(record)
        return self._records


def _audit_record(line: bytes) -> AuditRecord | None:
    try:
        event = json.loads(line)
    except ValueError:
        return None
    if (event.get("user") or {}).get("uid") != COLLECTOR or event.get("stage") != "ResponseComplete":
        return None
    ref = event.get("objectRef")
    received = dt.datetime.fromisoformat(str(event["requestReceivedTimestamp"]).replace("Z", "+00:00"))
    if not ref:
        return AuditRecord(received.timestamp(), "discovery", None, None)
    return AuditRecord(
        received.timestamp(), str(event.get("verb")), ref.get("resource"), ref.get("subresource")
    )


@contextlib.contextmanager
def cluster(
    kube_apiserver: str | None,
    seed: int,
    build: Callable[[SimCluster], None],
    workdir: Path | None = None,
    pools: list[tuple[str, int]] | None = None,
) -> Iterator[tuple[SimCluster, Server, float]]:
    """A cluster built by `build(sim)` on the simulated API server, or on a real one when
    `kube_apiserver` names a directory with bin/kube-apiserver and bin/etcd; yields (the actors, the
    server, the seconds the build took).  `pools`: the IP pools ((CIDR, block prefix), the simulator's
    default when None)."""
    if kube_apiserver is None:
        store = Store(seed=seed)
        sim = SimCluster(store, seed=seed, pools=pools)
        t0 = time.monotonic()
        build(sim)
        built = time.monotonic() - t0
        with SimApiServer(store) as server:
            yield sim, server, built
        return
    from lab.realapi import RealCluster  # noqa: PLC0415 - only this way needs it

    root = Path(tempfile.mkdtemp(prefix="ipamgc-bench-realapi-", dir=workdir))
    real = RealCluster(root, bin_dir=Path(kube_apiserver) / "bin", kubevirt=False)
    try:
        real.start()
        rest = real.store()
        try:
            # RestStore: the Store verbs the actors use, over REST
            sim = SimCluster(rest, seed=seed, pools=pools)  # type: ignore[arg-type]
            t0 = time.monotonic()
            build(sim)
            rest.settle()
            built = time.monotonic() - t0
            yield sim, RealServer(real, rest), built
        finally:
            rest.close()
    finally:
        real.stop()
        shutil.rmtree(root, ignore_errors=True)


# Pods sampled for `mean_pod_bytes`: enough for a mean within a few per cent (the sizes vary little).
POD_SAMPLE = 500


def mean_pod_bytes(sim: SimCluster) -> float | None:
    """The mean JSON bytes of a pod as the simulated server serves it (the report's
    `config.pod_json_bytes_mean`), from the first `POD_SAMPLE` pods; None on a real kube-apiserver (a
    list of every pod would cost what the benchmark measures; docs/pod-sizes.md has its sizes)."""
    if not isinstance(sim.store, Store):
        return None
    items = sim.store.list("pods", copy=False)["items"][:POD_SAMPLE]
    if not items:
        return None
    return round(sum(len(json.dumps(p, separators=(",", ":"))) for p in items) / len(items), 1)
