"""Which Kubernetes cluster a Redis, an audit record or a command works against.

Two clusters can look alike (the same node names, the same pool CIDRs), and a Redis collected for one must
never take release records made against another.  A cluster is named by its API server's URL, as the
client reaches it, and by the uid of its `kube-system` namespace: the URL alone differs between a pod
(`https://10.96.0.1:443`) and an operator's kubeconfig for the same cluster, while the uid is the same
from everywhere and differs between any two clusters (it is made once, when the cluster is created).

The watcher writes its identity to `P:cluster` (`shared/keys.py`); the leader stamps it into its audit
records; `ipamgc release` compares its own against it before writing anything (`same_cluster`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

FIELD_SERVER = "server"
FIELD_UID = "kube_system_uid"
FIELD_AT = "at"


@dataclass(frozen=True, slots=True)
class ClusterIdentity:
    server: str  # the API server URL, as this process's client reaches it
    uid: str = ""  # namespace kube-system's metadata.uid; "" when it could not be read

    def describe(self) -> str:
        return f"{self.server or '(unknown server)'} (kube-system uid {self.uid or 'unknown'})"

    def matches(self, wanted: str) -> bool:
        """`audit --cluster X`: X is the server URL or the kube-system uid (a prefix of it is enough)."""
        return bool(wanted) and (wanted == self.server or (bool(self.uid) and self.uid.startswith(wanted)))

    def to_mapping(self, at: float) -> dict[Any, str]:  # Any: redis-py's invariant key type
        return {FIELD_SERVER: self.server, FIELD_UID: self.uid, FIELD_AT: repr(at)}


def _text(value: object) -> str:
    if value is None:
        return ""
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def from_mapping(raw: Mapping[Any, Any]) -> ClusterIdentity | None:
    """The identity in a `P:cluster` hash (as redis-py returns it); None when there is none."""
    fields = {_text(k): _text(v) for k, v in raw.items()}
    if not fields.get(FIELD_SERVER) and not fields.get(FIELD_UID):
        return None
    return ClusterIdentity(fields.get(FIELD_SERVER, ""), fields.get(FIELD_UID, ""))


def same_cluster(a: ClusterIdentity, b: ClusterIdentity) -> bool:
    """Whether `a` and `b` name one cluster: by the kube-system uid when both have one (the URL may
    differ: in-cluster address against a kubeconfig's), else by the server URL."""
    if a.uid and b.uid:
        return a.uid == b.uid
    return a.server.rstrip("/") == b.server.rstrip("/")
