"""Read the identity of the cluster an ApiClient reaches (`shared/cluster.py`): its server URL and the
uid of namespace `kube-system`, one GET.

A client that may not read the namespace (403) or a server without it (404) still has an identity, by
URL only; any other failure is raised (`KubeError`): the caller decides whether to wait or go on.
"""

from __future__ import annotations

from kubeio.client import ApiClient
from kubeio.errors import translate
from kubeio.http import ApiError, Http
from shared.cluster import ClusterIdentity

KUBE_SYSTEM_PATH = "/api/v1/namespaces/kube-system"


def read_identity(api: ApiClient, timeout: tuple[float, float] = (5.0, 10.0)) -> ClusterIdentity:
    server = str(api.configuration.host).rstrip("/")
    try:
        doc = Http(api, timeout=timeout).json("GET", KUBE_SYSTEM_PATH, what="get namespace kube-system")
    except ApiError as exc:
        if exc.status in (403, 404):
            return ClusterIdentity(server, "")
        raise translate(exc, "get namespace kube-system") from exc
    meta = doc.get("metadata")
    uid = meta.get("uid") if isinstance(meta, dict) else None
    return ClusterIdentity(server, uid if isinstance(uid, str) else "")
