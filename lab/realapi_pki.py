"""The real API server harness's identities and PKI (`lab/realapi.py` runs the processes): a throwaway
CA and serving certificate, and one static token per identity, the components' as the ServiceAccount
users deploy/'s bindings name.
"""

from __future__ import annotations

import base64
import os
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

NAMESPACE = "ipamgc"


class HarnessError(Exception):
    """The real API server could not be built or started (one line)."""


def _token() -> str:
    return base64.b32encode(os.urandom(20)).decode().lower()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _openssl(*args: str) -> None:
    done = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False, timeout=60)
    if done.returncode != 0:
        raise HarnessError(f"openssl {args[0]} failed: {done.stderr.strip()[-200:]}")


def make_pki(d: Path) -> None:
    """A throwaway CA, a serving certificate for 127.0.0.1 signed by it, and the ServiceAccount key."""
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(d / "ca.key"),
             "-out", str(d / "ca.crt"), "-days", "1", "-subj", "/CN=ipamgc-realapi-ca")  # fmt: skip
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(d / "server.key"),
             "-out", str(d / "server.csr"), "-subj", "/CN=127.0.0.1")  # fmt: skip
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl("x509", "-req", "-in", str(d / "server.csr"), "-CA", str(d / "ca.crt"), "-CAkey",
             str(d / "ca.key"), "-CAcreateserial", "-out", str(d / "server.crt"), "-days", "1",
             "-extfile", str(d / "san.ext"))  # fmt: skip
    _openssl("genrsa", "-out", str(d / "sa.key"), "2048")


@dataclass(frozen=True)
class Identity:
    name: str  # what the tests call it: admin, watcher, leader, check
    user: str
    groups: tuple[str, ...]
    token: str


def service_account(name: str, sa: str) -> Identity:
    user = f"system:serviceaccount:{NAMESPACE}:{sa}"
    groups = ("system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}", "system:authenticated")
    return Identity(name, user, groups, _token())


def identities() -> dict[str, Identity]:
    ids = [
        Identity("admin", "realapi-admin", ("system:masters",), _token()),
        # `ipamgc bench --kube-apiserver`: the collector under measure (ipamgc's or Calico's), apart from
        # the actors (admin) in the audit log
        Identity("collector", "bench-collector", ("system:masters",), _token()),
        service_account("watcher", "ipamgc-watcher"),
        service_account("leader", "ipamgc-leader"),
        service_account("release", "ipamgc-leader"),  # `ipamgc release --from-report`: the leader's rights
        # `ipamgc check`: a person auditing, bound to deploy/'s ipamgc-check ClusterRole by the harness
        Identity("check", "ipamgc-auditor", ("system:authenticated",), _token()),
    ]
    return {i.name: i for i in ids}
