"""A real kube-apiserver and etcd on loopback: the `realapi` test tier's cluster and `ipamgc bench
--kube-apiserver`'s.

`RealCluster` starts etcd and kube-apiserver (built by `.ci/realapi-build`, found through
`IPAMGC_REALAPI_BIN` or by running that script, which is a no-op once the binaries are cached) with a
throwaway CA and serving certificate, one static token per identity, RBAC authorization and an audit log
of every request (metadata level).  It installs one of Calico's CRD sets (`IPAMGC_CALICO_CRDS`, default
`../shared/calico-crds`) and deploy/'s ServiceAccounts, ClusterRoles, Roles and bindings, and hands out
a kubeconfig per identity: each ipamgc component's ServiceAccount is a token user
`system:serviceaccount:ipamgc:<sa>` in the groups a ServiceAccount token carries, so deploy/'s bindings
apply to it exactly as in a cluster.

Every failure to build or start raises `HarnessError` with one line: the tier fails, it never skips.  The
identities and the PKI are `lab/realapi_pki.py`.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ipamgc import childproc
from lab.apiserver.store import SimApiError
from lab.cluster.restapi import RestStore
from lab.realapi_pki import HarnessError, Identity, free_port, identities, make_pki
from shared.calicogroup import V1, V3, CalicoGroup

ROOT = Path(__file__).resolve().parents[1]  # the checkout (deploy/, .ci/)
DEPLOY = ROOT / "deploy"


def wait_until(ready: Any, timeout: float, interval: float, what: str) -> None:
    """Poll `ready()` until it is true; HarnessError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise HarnessError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def _crds_root() -> Path:
    """Calico's CRDs: `IPAMGC_CALICO_CRDS`, else `shared/calico-crds` beside the checkout (CI's layout) or
    beside its parent (a worktree's)."""
    given = os.environ.get("IPAMGC_CALICO_CRDS")
    candidates = [Path(given)] if given else [p / "shared" / "calico-crds" for p in ROOT.parents[:2]]
    for candidate in candidates:
        if (candidate / "v1").is_dir():
            return candidate
    raise HarnessError(f"Calico's CRDs not found (set IPAMGC_CALICO_CRDS): tried {candidates}")


def binaries() -> Path:
    """The directory holding bin/etcd and bin/kube-apiserver (built when missing)."""
    given = os.environ.get("IPAMGC_REALAPI_BIN")
    if given:
        root = Path(given)
    else:
        done = subprocess.run(
            ["bash", str(ROOT / ".ci" / "realapi-build")], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise HarnessError(f"building etcd/kube-apiserver failed: {last}")
        root = Path(done.stdout.strip().splitlines()[-1])
    for name in ("etcd", "kube-apiserver"):
        if not os.access(root / "bin" / name, os.X_OK):
            raise HarnessError(f"no executable {root / 'bin' / name} (run .ci/realapi-build)")
    return root / "bin"


AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata"}],
}


@dataclass
class RealCluster:
    """etcd + kube-apiserver in `workdir`; `start()` / `stop()`; `restart_apiserver()`; `compact()`."""

    workdir: Path
    group: CalicoGroup = V1
    kubevirt: bool = True
    bin_dir: Path = field(default_factory=binaries)
    ids: dict[str, Identity] = field(default_factory=identities)
    etcd_port: int = 0
    port: int = 0
    etcd: subprocess.Popen[bytes] | None = None
    apiserver: subprocess.Popen[bytes] | None = None
    timings: dict[str, float] = field(default_factory=dict)
    ready_at: list[float] = field(default_factory=list)  # wall-clock times /readyz first answered 200

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def audit_log(self) -> Path:
        return self.workdir / "audit.log"

    @property
    def ca(self) -> Path:
        return self.workdir / "ca.crt"

    # -- processes ----------------------------------------------------------------------------------------

    def start(self) -> None:
        t0 = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        make_pki(self.workdir)
        with (self.workdir / "tokens.csv").open("w") as f:
            for i in self.ids.values():
                # the uid is the identity's name: `release` shares the leader's ServiceAccount (and its
                # rights), the audit log tells their calls apart by uid
                f.write(f'{i.token},{i.user},{i.name},"{",".join(i.groups)}"\n')
        (self.workdir / "audit-policy.yaml").write_text(yaml.safe_dump(AUDIT_POLICY))
        self.etcd_port, peer = free_port(), free_port()
        self.etcd = self._spawn(
            "etcd",
            [
                str(self.bin_dir / "etcd"), "--name", "realapi", "--data-dir", str(self.workdir / "etcd"),
                "--listen-client-urls", f"http://127.0.0.1:{self.etcd_port}",
                "--advertise-client-urls", f"http://127.0.0.1:{self.etcd_port}",
                "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                "--initial-cluster", f"realapi=http://127.0.0.1:{peer}",
                "--listen-metrics-urls", "",
                "--unsafe-no-fsync", "--log-level", "warn",
            ],
        )  # fmt: skip
        self._wait(lambda: self._etcd_call("/v3/maintenance/status", {}) is not None, "etcd", self.etcd)
        self.timings["etcd_ready"] = time.monotonic() - t0
        self.port = free_port()
        self._start_apiserver()
        self.timings["apiserver_ready"] = time.monotonic() - t0
        self._install()
        self.timings["installed"] = time.monotonic() - t0

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = (self.workdir / f"{name}.log").open("ab")
        try:
            return childproc.popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        except OSError as exc:
            raise HarnessError(f"cannot start {name}: {exc}") from exc
        finally:
            log.close()

    def _start_apiserver(self) -> None:
        d = self.workdir
        self.apiserver = self._spawn(
            "kube-apiserver",
            [
                str(self.bin_dir / "kube-apiserver"),
                "--etcd-servers", f"http://127.0.0.1:{self.etcd_port}",
                "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
                "--secure-port", str(self.port),
                "--tls-cert-file", str(d / "server.crt"), "--tls-private-key-file", str(d / "server.key"),
                "--cert-dir", str(d / "certs"),
                "--token-auth-file", str(d / "tokens.csv"),
                "--authorization-mode", "RBAC",
                "--service-account-issuer", "https://127.0.0.1",
                "--service-account-key-file", str(d / "sa.key"),
                "--service-account-signing-key-file", str(d / "sa.key"),
                "--service-cluster-ip-range", "10.250.0.0/24",
                "--endpoint-reconciler-type", "none",  # no `kubernetes` Service endpoint: loopback only
                "--audit-policy-file", str(d / "audit-policy.yaml"),
                "--audit-log-path", str(self.audit_log), "--audit-log-format", "json",
                "--audit-log-mode", "blocking", "--audit-log-maxsize", "0",
                "--enable-priority-and-fairness=false",
                "--profiling=false",
                "--v", "1",
            ],
        )  # fmt: skip
        self._wait(self._ready, "kube-apiserver", self.apiserver, timeout=180)
        self.ready_at.append(time.time())

    def _wait(self, ready: Any, name: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
        def up() -> bool:
            if proc.poll() is not None:
                tail = (self.workdir / f"{name}.log").read_text(errors="replace").strip().splitlines()
                raise HarnessError(f"{name} exited ({proc.returncode}): {(tail or ['no output'])[-1][:300]}")
            return bool(ready())

        wait_until(up, timeout, 0.1, what=f"{name} ready (log: {self.workdir / name}.log)")

    def _ready(self) -> bool:
        ctx = ssl.create_default_context(cafile=str(self.ca))
        req = urllib.request.Request(
            f"{self.url}/readyz", headers={"Authorization": f"Bearer {self.ids['admin'].token}"}
        )
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def restart_apiserver(self) -> float:
        """Kill kube-apiserver (SIGKILL: a crash, or a node lost under it) and start it again on the same
        port and etcd; returns how long it was unavailable (s).  A SIGTERM would be no gentler here: its
        graceful termination did not end within 20 s on this build."""
        t0 = time.monotonic()
        if self.apiserver is not None and self.apiserver.poll() is None:
            self.apiserver.kill()
            self.apiserver.wait(timeout=10)
        self._start_apiserver()
        return time.monotonic() - t0

    def stop(self) -> None:
        self._stop(self.apiserver)
        self._stop(self.etcd)

    @staticmethod
    def _stop(proc: subprocess.Popen[bytes] | None) -> None:
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=5)  # kube-apiserver's graceful termination can take longer: killed then
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    # -- etcd ---------------------------------------------------------------------------------------------

    def _etcd_call(self, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.etcd_port}{path}", data=json.dumps(body).encode(), method="POST"
        )
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                doc = json.loads(r.read())
                return doc if isinstance(doc, dict) else None
        except OSError:
            return None

    def etcd_revision(self) -> int:
        doc = self._etcd_call("/v3/kv/range", {"key": base64.b64encode(b"/registry/health").decode()})
        if doc is None:
            raise HarnessError("etcd did not answer a range request")
        return int(doc["header"]["revision"])

    def compact(self) -> int:
        """Compact etcd's history up to its current revision (what kube-apiserver's periodic compaction
        does every 5 minutes): every older resourceVersion is gone."""
        rev = self.etcd_revision()
        if self._etcd_call("/v3/kv/compaction", {"revision": str(rev), "physical": True}) is None:
            raise HarnessError("etcd compaction failed")
        return rev

    # -- clients ------------------------------------------------------------------------------------------

    def kubeconfig(self, who: str) -> Path:
        path = self.workdir / f"kubeconfig-{who}"
        if not path.exists():
            doc = {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "realapi",
                        "cluster": {"server": self.url, "certificate-authority": str(self.ca)},
                    }
                ],
                "users": [{"name": who, "user": {"token": self.ids[who].token}}],
                "contexts": [{"name": who, "context": {"cluster": "realapi", "user": who}}],
                "current-context": who,
            }
            path.write_text(yaml.safe_dump(doc))
        return path

    def store(self, group: CalicoGroup | None = None) -> RestStore:
        """The actors' store, as the cluster admin (kubelet, controllers and CNI together)."""
        return RestStore(self.url, self.ids["admin"].token, str(self.ca), group or self.group)

    # -- installation -------------------------------------------------------------------------------------

    def apply(self, store: RestStore, obj: dict[str, Any]) -> None:
        """Create one object of any kind (server-side apply would do too; create is what we need)."""
        api_version, kind = obj["apiVersion"], obj["kind"]
        plural = _PLURALS[kind]
        prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        ns = obj["metadata"].get("namespace")
        path = prefix + (f"/namespaces/{ns}" if ns else "") + f"/{plural}"
        try:
            store._request("POST", path, obj)
        except SimApiError as exc:
            if exc.code != 409:
                raise HarnessError(f"cannot create {kind}/{obj['metadata']['name']}: {exc}") from exc

    def _install(self) -> None:
        store = self.store()
        try:
            root = _crds_root()
            files = sorted((root / ("v3" if self.group == V3 else "v1")).glob("*.yaml"))
            if self.kubevirt:
                files.append(root / "kubevirt" / "kubevirt-test-crds.yaml")
            crds = [d for f in files for d in yaml.safe_load_all(f.read_text()) if d]
            for crd in crds:
                self.apply(store, crd)
            for doc in yaml.safe_load_all((DEPLOY / "namespace.yaml").read_text()):
                if doc:
                    self.apply(store, doc)
            for doc in yaml.safe_load_all((DEPLOY / "rbac.yaml").read_text()):
                if doc:
                    self.apply(store, doc)
            self.apply(store, CHECK_BINDING)
            self._wait_established(store, [c["metadata"]["name"] for c in crds])
        finally:
            store.close()

    def _wait_established(self, store: RestStore, names: list[str]) -> None:
        pending = set(names)

        def established() -> bool:
            for name in sorted(pending):
                crd = store._request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
                conds = {c["type"]: c["status"] for c in (crd.get("status") or {}).get("conditions") or []}
                if conds.get("Established") == "True" and self._serves(store, crd):
                    pending.discard(name)
            return not pending

        wait_until(established, 60, 0.1, what="Calico's CRDs established and served")

    @staticmethod
    def _serves(store: RestStore, crd: dict[str, Any]) -> bool:
        """The CRD's resource answers a list (its handler starts a moment after `Established`)."""
        spec = crd["spec"]
        version = next(v["name"] for v in spec["versions"] if v.get("storage"))
        try:
            path = f"/apis/{spec['group']}/{version}/{spec['names']['plural']}"
            store._request("GET", path, query={"limit": "1"})
        except SimApiError as exc:
            if exc.code == 404:
                return False
            raise
        return True

    # -- the audit log ------------------------------------------------------------------------------------

    def audit_events(self) -> list[dict[str, Any]]:
        out = []
        with contextlib.suppress(FileNotFoundError), self.audit_log.open() as f:
            for line in f:
                with contextlib.suppress(ValueError):
                    out.append(json.loads(line))
        return out


CHECK_BINDING = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "ClusterRoleBinding",
    "metadata": {"name": "ipamgc-check-auditor"},
    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "ipamgc-check"},
    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "ipamgc-auditor"}],
}

_PLURALS = {
    "CustomResourceDefinition": "customresourcedefinitions",
    "Namespace": "namespaces",
    "ServiceAccount": "serviceaccounts",
    "ClusterRole": "clusterroles",
    "ClusterRoleBinding": "clusterrolebindings",
    "Role": "roles",
    "RoleBinding": "rolebindings",
}


@contextlib.contextmanager
def running(workdir: Path, group: CalicoGroup = V1) -> Iterator[RealCluster]:
    cluster = RealCluster(workdir, group)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        if os.environ.get("IPAMGC_REALAPI_KEEP") is None:
            shutil.rmtree(workdir / "etcd", ignore_errors=True)
