"""The leader's Kubernetes edge: the only module of `workers/` that imports `kubernetes`.

The leader reads single objects (a node, a pod, a block, a handle, an affinity), lists a host's
BlockAffinities by label, and writes IPAMBlocks, IPAMHandles and BlockAffinities conditionally: replace
with the resourceVersion it read (409 when someone wrote in between) and delete with preconditions
(uid + resourceVersion).  Those conditions, not our own election, are what makes a write safe: the API
server is the real fence.  Requests are raw JSON over the client's configuration and pool
(`kubeio.http`: a release is ~9 requests, and the generated methods cost ~70 µs each on top of the HTTP
exchange), never the client's models, and every failure becomes a `shared.errors` error here.  The Lease
of the leader election is `kubeio.lease.Lease` (`lease_candidate`), bound to our ApiClient.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

import yaml  # type: ignore[import-untyped]  # kubernetes' own dependency
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from kubeio.http import ApiError, Http, path_part
from kubeio.lease import Lease
from shared.calicogroup import CalicoGroup, choose, served_group_names
from shared.errors import ConfigError, IpamgcError, PermanentError, TransientError

log = logging.getLogger(__name__)

KUBEVIRT_GROUP = "kubevirt.io"
KUBEVIRT_VERSION = "v1"
JsonObj = dict[str, Any]


class KubeError(IpamgcError):
    """Base of the API errors below; `status` is the HTTP status (0: no answer)."""

    status = 0


class NotFound(KubeError, PermanentError):
    status = 404


class Conflict(KubeError, TransientError):
    """409: the object changed since we read it (or a delete precondition failed): re-read, re-decide."""

    status = 409


class ApiUnavailable(KubeError, TransientError):
    """5xx, 429, a dropped connection, an unreadable body: retry later."""


class ApiRefused(KubeError, PermanentError):
    """Any other answer (401, 403, 422, …): retrying as-is cannot help."""


def _translate(exc: ApiError) -> KubeError:
    status, message = exc.status, str(exc)
    err: KubeError
    if status == 404:
        err = NotFound(message)
    elif status == 409:
        err = Conflict(message)
    elif status == 429 or status >= 500 or status == 0:
        err = ApiUnavailable(message)
    else:
        err = ApiRefused(message)
    err.status = status
    return err


def _one_line(exc: BaseException) -> str:
    """An exception as one line (YAML errors span several)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def api_client(
    kubeconfig: str | None = None, context: str | None = None, user_agent: str | None = None
) -> k8s.ApiClient:
    """An ApiClient: in-cluster config in a pod (no kubeconfig given), else the kubeconfig file."""
    cfg = k8s.Configuration()
    try:
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            k8s_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        else:
            k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, context=context, client_configuration=cfg
            )
    except (k8s_config.ConfigException, OSError, ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot load Kubernetes configuration: {_one_line(exc)}") from exc
    except (TypeError, KeyError, AttributeError) as exc:  # YAML that is not a kubeconfig's shape
        raise ConfigError(
            f"cannot load Kubernetes configuration: not a kubeconfig: {_one_line(exc)}"
        ) from exc
    api = k8s.ApiClient(cfg)
    if user_agent:
        api.user_agent = user_agent
    return api


class CalicoApi:
    """Single-object reads and conditional writes, raw JSON in and out.

    Calico's objects are named by their crd.projectcalico.org/v1 plurals (`ipamconfigs`) and read and
    written in `calico`, the configured group, else the one the server's `/apis` says
    (`shared.calicogroup.choose`), asked at the first Calico call and kept; a failed discovery is that
    call's error (retried by its caller), never a guess."""

    def __init__(
        self,
        api: k8s.ApiClient,
        *,
        timeout: tuple[float, float] = (10.0, 30.0),
        calico: CalicoGroup | None = None,
    ) -> None:
        self._http = Http(api, timeout=timeout)
        self._calico_group = calico
        self._calico_lock = threading.Lock()
        if calico is not None:
            log.info("Calico API group: %s (configured)", calico)

    def calico(self) -> CalicoGroup:
        """The API group of Calico's objects (see the class docstring)."""
        with self._calico_lock:
            if self._calico_group is None:
                doc = self._json("GET", "/apis", "discover API groups")
                try:
                    served = served_group_names(doc)
                except ValueError as exc:
                    raise ApiUnavailable(f"discover API groups: {exc}") from exc
                self._calico_group = choose(None, served)
                log.info("Calico API group: %s (discovered)", self._calico_group)
            return self._calico_group

    def _json(self, method: str, path: str, what: str, **kwargs: Any) -> JsonObj:
        try:
            return self._http.json(method, path, what=what, **kwargs)
        except ApiError as exc:
            raise _translate(exc) from exc

    def _calico(self, plural: str, name: str | None = None) -> str:
        group = self.calico()
        base = f"/apis/{group.name}/{group.version}/{group.plural(plural)}"
        return base if name is None else f"{base}/{path_part(name)}"

    # -- core ---------------------------------------------------------------------------------------

    def get_node(self, name: str) -> JsonObj:
        return self._json("GET", f"/api/v1/nodes/{path_part(name)}", f"get node {name}")

    def get_pod(self, namespace: str, name: str) -> JsonObj:
        path = f"/api/v1/namespaces/{path_part(namespace)}/pods/{path_part(name)}"
        return self._json("GET", path, f"get pod {namespace}/{name}")

    # -- KubeVirt (kubevirt.io/v1, namespaced) -----------------------------------------------------------

    def kubevirt_installed(self) -> bool:
        """Whether the API server serves kubevirt.io/v1 (its `/apis` discovery document)."""
        doc = self._json("GET", "/apis", "discover API groups")
        for group in doc.get("groups") or []:
            if isinstance(group, dict) and group.get("name") == KUBEVIRT_GROUP:
                versions = group.get("versions") or []
                return any(isinstance(v, dict) and v.get("version") == KUBEVIRT_VERSION for v in versions)
        return False

    def get_kubevirt(self, plural: str, namespace: str, name: str) -> JsonObj:
        """A VirtualMachine or VirtualMachineInstance (`plural`)."""
        path = (
            f"/apis/{KUBEVIRT_GROUP}/{KUBEVIRT_VERSION}/namespaces/{path_part(namespace)}"
            f"/{plural}/{path_part(name)}"
        )
        return self._json("GET", path, f"get {plural}.{KUBEVIRT_GROUP} {namespace}/{name}")

    # -- Calico objects (cluster-scoped) -----------------------------------------------------------------

    def get(self, plural: str, name: str) -> JsonObj:
        return self._json("GET", self._calico(plural, name), f"get {plural}/{name}")

    def replace(self, plural: str, body: JsonObj) -> JsonObj:
        """PUT `body`, conditional on its `metadata.resourceVersion` (which callers always carry)."""
        name = body["metadata"]["name"]
        if not body["metadata"].get("resourceVersion"):
            raise ValueError(f"refusing an unconditional replace of {plural}/{name}")
        return self._json("PUT", self._calico(plural, name), f"replace {plural}/{name}", body=body)

    def delete(self, plural: str, name: str, uid: str, resource_version: str) -> None:
        """DELETE with preconditions: 409 unless the object is exactly the one we last wrote."""
        if not uid or not resource_version:
            raise ValueError(f"refusing a delete of {plural}/{name} without preconditions")
        options = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "preconditions": {"uid": uid, "resourceVersion": resource_version},
        }
        self._json("DELETE", self._calico(plural, name), f"delete {plural}/{name}", body=options)

    def list(self, plural: str, label_selector: str) -> list[JsonObj]:
        """Every object of `plural` matching `label_selector` (one page: a host has few affinities)."""
        body = self._json(
            "GET",
            self._calico(plural),
            f"list {plural} -l {label_selector}",
            query={"labelSelector": label_selector},
        )
        items = body.get("items") or []
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise ApiUnavailable(f"list {plural}: items is not a list of objects")
        return items


# -- the Lease --------------------------------------------------------------------------------------------


def lease_candidate(
    api: k8s.ApiClient, *, namespace: str, name: str, identity: str, lease_seconds: int
) -> Lease:
    """The leader's Lease candidate on our ApiClient: one attempt at a time to acquire or renew it
    (`kubeio.lease.Lease`, client-go's algorithm; `release` empties the holder on a graceful stop).  The
    loop around it (interruptible waits, deadlines, stopping the work) is `workers.election`'s."""
    return Lease(Http(api), namespace=namespace, name=name, identity=identity, lease_seconds=lease_seconds)
