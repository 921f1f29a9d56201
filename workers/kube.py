"""The leader's Kubernetes edge: the only module of `workers/` that imports `kubernetes`.

The leader reads single objects (a node, a pod, a block, a handle, an affinity), lists a host's
BlockAffinities by label, and writes IPAMBlocks, IPAMHandles and BlockAffinities conditionally: replace
with the resourceVersion it read (409 when someone wrote in between) and delete with preconditions
(uid + resourceVersion).  Those conditions, not our own election, are what makes a write safe: the API
server is the real fence.  Bodies are read with orjson (`_preload_content=False`), never the client's
models, and every library exception becomes a `shared.errors` error here.  The Lease of the leader
election is driven through `kubernetes.leaderelection` (`LeaseCandidate`), bound to our ApiClient.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import threading
import time
from typing import Any

import orjson
import urllib3
import yaml  # type: ignore[import-untyped]  # kubernetes' own dependency
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.leaderelectionrecord import LeaderElectionRecord
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

from shared.calicogroup import CalicoGroup, choose, served_group_names
from shared.errors import ConfigError, IpamgcError, PermanentError, TransientError

log = logging.getLogger(__name__)

# kubernetes.leaderelection has no type hints: its objects are Any here.
_Config: Any = electionconfig.Config
_LeaderElection: Any = leaderelection.LeaderElection
_Record: Any = LeaderElectionRecord

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


def _translate(exc: Exception, what: str) -> KubeError:
    if isinstance(exc, ApiException):
        status = int(exc.status or 0)
        message = f"{what}: HTTP {status}: {exc.reason}"
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
    return ApiUnavailable(f"{what}: {type(exc).__name__}: {exc}")


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
        self._core = k8s.CoreV1Api(api)
        self._custom = k8s.CustomObjectsApi(api)
        self._apis = k8s.ApisApi(api)
        self._timeout = timeout
        self._calico = calico
        self._calico_lock = threading.Lock()
        if calico is not None:
            log.info("Calico API group: %s (configured)", calico)

    def calico(self) -> CalicoGroup:
        """The API group of Calico's objects (see the class docstring)."""
        with self._calico_lock:
            if self._calico is None:
                doc = self._json("discover API groups", self._apis.get_api_versions)
                try:
                    served = served_group_names(doc)
                except ValueError as exc:
                    raise ApiUnavailable(f"discover API groups: {exc}") from exc
                self._calico = choose(None, served)
                log.info("Calico API group: %s (discovered)", self._calico)
            return self._calico

    def _group(self, plural: str) -> tuple[str, str, str]:
        group = self.calico()
        return group.name, group.version, group.plural(plural)

    def _json(self, what: str, call: Any, *args: Any, **kwargs: Any) -> JsonObj:
        try:
            resp = call(*args, _preload_content=False, _request_timeout=self._timeout, **kwargs)
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            raise _translate(exc, what) from exc
        try:
            body = orjson.loads(resp.data)
        except (urllib3.exceptions.HTTPError, OSError, orjson.JSONDecodeError) as exc:
            raise ApiUnavailable(f"{what}: unreadable answer: {exc}") from exc
        finally:
            resp.release_conn()
        if not isinstance(body, dict):
            raise ApiUnavailable(f"{what}: the answer is not an object")
        return body

    # -- core ---------------------------------------------------------------------------------------

    def get_node(self, name: str) -> JsonObj:
        return self._json(f"get node {name}", self._core.read_node, name)

    def get_pod(self, namespace: str, name: str) -> JsonObj:
        return self._json(f"get pod {namespace}/{name}", self._core.read_namespaced_pod, name, namespace)

    # -- KubeVirt (kubevirt.io/v1, namespaced) -----------------------------------------------------------

    def kubevirt_installed(self) -> bool:
        """Whether the API server serves kubevirt.io/v1 (its `/apis` discovery document)."""
        doc = self._json("discover API groups", self._apis.get_api_versions)
        for group in doc.get("groups") or []:
            if isinstance(group, dict) and group.get("name") == KUBEVIRT_GROUP:
                versions = group.get("versions") or []
                return any(isinstance(v, dict) and v.get("version") == KUBEVIRT_VERSION for v in versions)
        return False

    def get_kubevirt(self, plural: str, namespace: str, name: str) -> JsonObj:
        """A VirtualMachine or VirtualMachineInstance (`plural`)."""
        return self._json(
            f"get {plural}.{KUBEVIRT_GROUP} {namespace}/{name}",
            self._custom.get_namespaced_custom_object,
            KUBEVIRT_GROUP,
            KUBEVIRT_VERSION,
            namespace,
            plural,
            name,
        )

    # -- Calico objects (cluster-scoped) -----------------------------------------------------------------

    def get(self, plural: str, name: str) -> JsonObj:
        return self._json(
            f"get {plural}/{name}", self._custom.get_cluster_custom_object, *self._group(plural), name
        )

    def replace(self, plural: str, body: JsonObj) -> JsonObj:
        """PUT `body`, conditional on its `metadata.resourceVersion` (which callers always carry)."""
        name = body["metadata"]["name"]
        if not body["metadata"].get("resourceVersion"):
            raise ValueError(f"refusing an unconditional replace of {plural}/{name}")
        return self._json(
            f"replace {plural}/{name}",
            self._custom.replace_cluster_custom_object,
            *self._group(plural),
            name,
            body,
        )

    def delete(self, plural: str, name: str, uid: str, resource_version: str) -> None:
        """DELETE with preconditions: 409 unless the object is exactly the one we last wrote."""
        if not uid or not resource_version:
            raise ValueError(f"refusing a delete of {plural}/{name} without preconditions")
        options = k8s.V1DeleteOptions(
            preconditions=k8s.V1Preconditions(uid=uid, resource_version=resource_version)
        )
        self._json(
            f"delete {plural}/{name}",
            self._custom.delete_cluster_custom_object,
            *self._group(plural),
            name,
            body=options,
        )

    def list(self, plural: str, label_selector: str) -> list[JsonObj]:
        """Every object of `plural` matching `label_selector` (one page: a host has few affinities)."""
        body = self._json(
            f"list {plural} -l {label_selector}",
            self._custom.list_cluster_custom_object,
            *self._group(plural),
            label_selector=label_selector,
        )
        items = body.get("items") or []
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise ApiUnavailable(f"list {plural}: items is not a list of objects")
        return items


# -- the Lease --------------------------------------------------------------------------------------------


class _LeaseLock(LeaseLock):
    """`LeaseLock` on a given ApiClient (the original builds one from the global default config)."""

    def __init__(self, name: str, namespace: str, identity: str, api: k8s.ApiClient) -> None:
        self.api_instance = k8s.CoordinationV1Api(api)
        self.name = name
        self.namespace = namespace
        self.identity = identity
        self.lease_reference = None


class LeaseCandidate:
    """One attempt at a time to acquire or renew the Lease, through `kubernetes.leaderelection`.

    The loop around it (interruptible waits, deadlines, stopping the work) is `workers.election`'s: the
    client's own `run()` sleeps uninterruptibly and never stops the work it started.
    """

    def __init__(
        self,
        api: k8s.ApiClient,
        *,
        namespace: str,
        name: str,
        identity: str,
        lease_seconds: int,
        renew_seconds: float,
        retry_seconds: float,
    ) -> None:
        self.identity = identity
        self.lock: Any = _LeaseLock(name, namespace, identity, api)
        self.config: Any = _Config(
            self.lock,
            lease_duration=lease_seconds,
            renew_deadline=renew_seconds,
            retry_period=retry_seconds,
            onstarted_leading=lambda: None,
            onstopped_leading=lambda: None,
        )
        self.election: Any = _LeaderElection(self.config)

    def try_acquire_or_renew(self) -> bool:
        """True when we hold the Lease after this call (False also on any API error, logged)."""
        try:
            return bool(self.election.try_acquire_or_renew())
        except (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            log.warning("lease %s: %s", self.lock.name, exc, extra={"identity": self.identity})
            return False

    def release(self) -> bool:
        """Empty the holder if it is still us (a standby then takes over within one retry period
        instead of waiting for the lease to expire); best effort, returns whether it was done."""
        with contextlib.suppress(ApiException, urllib3.exceptions.HTTPError, OSError, ValueError):
            # Re-read: the lock keeps the Lease as last read, not as last written.
            found, current = self.lock.get(self.lock.name, self.lock.namespace)
            if not found or current is None or current.holder_identity != self.identity:
                return False
            now = str(dt.datetime.fromtimestamp(time.time()))
            record = _Record("", str(self.config.lease_duration), current.acquire_time or now, now)
            # Conditional on the resourceVersion just read: 409 if anyone wrote it since.
            return bool(self.lock.update(self.lock.name, self.lock.namespace, record))
        return False
