"""The Kubernetes edge of the producer: paginated lists and watch streams, raw JSON in, typed items out.

The official client is used for its configuration, authentication and connection pool only (raw
requests through `kubeio.http`), never for its models (design.md: they cost ~15 s and +1 GB for 10,000
pods) nor its generated API classes; bodies are read with msgspec or orjson.  Watches are read off the
socket's buffer in bulk, their chunked framing decoded by `kubeio.chunked`, and split into lines.

`Reflector` is client-go's reflector for one resource: list (limit/continue), watch from the list's
resourceVersion with bookmarks, resume from the last resourceVersion seen when a watch ends, relist when
the server answers 410 Gone, and back off with full jitter on errors (honouring Retry-After).  Library
exceptions become `shared.errors` Transient/Permanent errors here.  Objects are typed with
`shared.parse`; a malformed one is logged with its kind and name, counted, and replaced by what keeps
IPs (`convert`): it never crashes the loop.
"""

from __future__ import annotations

import contextlib
import gc
import http.client
import io
import logging
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from enum import StrEnum
from typing import Any

import msgspec
import orjson
import urllib3
import yaml  # type: ignore[import-untyped]  # kubernetes' own dependency
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from kubeio.chunked import ChunkError, Dechunker
from kubeio.http import ApiError, Http
from producer import slim
from shared import kubevirt as kv
from shared.calicogroup import CalicoGroup, choose, served_group_names
from shared.duration import parse_duration
from shared.errors import (
    BadPodIP,
    ConfigError,
    IpamgcError,
    MalformedObject,
    PermanentError,
    TransientError,
)
from shared.ipamconfig import MAX_COOLDOWN_SECONDS, IPAMConfig, parse_ipam_config
from shared.keys import pod_key
from shared.model import LABEL_NODE_NETWORK_DURING_MIGRATION, Node, Pod
from shared.netaddr import AddressError, name_to_cidr, parse_network
from shared.parse import parse_block, parse_node, parse_pod

log = logging.getLogger(__name__)

# Retry-After values above this are not honoured as-is (a misbehaving proxy must not park us for hours).
MAX_RETRY_AFTER_SECONDS = 600.0


class Kind(StrEnum):
    """A listed/watched resource, by its plural."""

    NODES = "nodes"
    PODS = "pods"
    BLOCKS = "ipamblocks"
    CONTROLLERS_CONFIG = "kubecontrollersconfigurations"
    CLUSTER_INFO = "clusterinformations"
    HANDLES = "ipamhandles"
    AFFINITIES = "blockaffinities"
    VMS = "virtualmachines"  # kubevirt.io/v1, watched only while served (`producer/kubevirt.py`)
    VMIS = "virtualmachineinstances"
    IPAM_CONFIG = "ipamconfigs"  # served as `ipamconfigurations` in projectcalico.org/v3


# Kubernetes' own kinds and KubeVirt's (one group); every other one is Calico's, in the group
# `KubeApi.calico()` chose.
_CORE: dict[Kind, str] = {Kind.NODES: "Node", Kind.PODS: "Pod"}
_KUBEVIRT: dict[Kind, str] = {Kind.VMS: kv.VM_KIND, Kind.VMIS: kv.VMI_KIND}
WATCHED = (
    Kind.NODES,
    Kind.PODS,
    Kind.BLOCKS,
    Kind.CONTROLLERS_CONFIG,
    Kind.CLUSTER_INFO,
    Kind.IPAM_CONFIG,
)
# What the mirror must have listed before anything is decided: the IPAMConfig is not among them (only
# the leader's cooldown follows it, and it keeps its own live read when the mirror has none).
SYNC_GATED = tuple(k for k in WATCHED if k is not Kind.IPAM_CONFIG)
INVENTORY = (Kind.NODES, Kind.PODS, Kind.BLOCKS, Kind.HANDLES, Kind.AFFINITIES)


# -- errors --------------------------------------------------------------------------------------------


class KubeTransientError(TransientError):
    """An API call worth retrying: 5xx, 429, 409, a dropped connection, an unreadable body."""

    def __init__(self, message: str, *, status: int | None = None, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


class ResourceExpired(KubeTransientError):
    """410 Gone: the resourceVersion (or continue token) is compacted away; relist."""


class KubePermanentError(PermanentError):
    """An API answer retrying cannot fix as-is (401, 403, 404, 422, …)."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def retry_after_of(headers: Mapping[str, str] | None, body: object = None) -> float | None:
    """Seconds from a Retry-After header (delta or HTTP date), else from Status details."""
    value = headers.get("Retry-After") if headers is not None else None
    if value:
        try:
            return min(max(0.0, float(value)), MAX_RETRY_AFTER_SECONDS)
        except ValueError:
            with contextlib.suppress(TypeError, ValueError):
                when = parsedate_to_datetime(value).timestamp()
                return min(max(0.0, when - time.time()), MAX_RETRY_AFTER_SECONDS)
    if isinstance(body, Mapping):
        details = body.get("details")
        seconds = details.get("retryAfterSeconds") if isinstance(details, Mapping) else None
        if isinstance(seconds, int) and not isinstance(seconds, bool) and seconds > 0:
            return min(float(seconds), MAX_RETRY_AFTER_SECONDS)
    return None


def classify_status(status: int, message: str, retry_after: float | None = None) -> IpamgcError:
    if status == 410:
        return ResourceExpired(message, status=status)
    if status in (409, 429) or status >= 500 or status == 0:
        return KubeTransientError(message, status=status, retry_after=retry_after)
    return KubePermanentError(message, status=status)


def list_calico_items(api: KubeApi, plural: str, timeout: tuple[float, float] = (10.0, 30.0)) -> list[object]:
    """Every object of a cluster-scoped Calico kind (`plural`: its crd.projectcalico.org/v1 name), as raw
    JSON (one unpaged list, no client models), in the group `api` chose: the small kinds the metrics
    read (IPPools, IPReservations).  An API failure is `translate`d."""
    group = api.calico()
    path = f"/apis/{group.name}/{group.version}/{group.plural(plural)}"
    try:
        body = orjson.loads(api.http.request("GET", path, what=f"list {plural}", timeout=timeout))
    except (ApiError, orjson.JSONDecodeError) as exc:
        raise translate(exc, f"list {plural}") from exc
    items = body.get("items") if isinstance(body, dict) else None
    return items if isinstance(items, list) else []


def translate(exc: Exception, what: str) -> IpamgcError:
    """A library exception as a `shared.errors` error (the only place they are translated)."""
    if isinstance(exc, ApiError):
        if exc.status == 0:  # no answer (the exchange failed, the body unreadable): its message says so
            return KubeTransientError(str(exc))
        error_body: object = None
        with contextlib.suppress(orjson.JSONDecodeError):
            error_body = orjson.loads(exc.body) if exc.body else None
        text = error_body.get("message") if isinstance(error_body, Mapping) else exc.reason
        message = f"{what}: HTTP {exc.status}: {text}"
        return classify_status(exc.status, message, retry_after_of(exc.headers, error_body))
    if isinstance(exc, ApiException):
        body: object = None
        with contextlib.suppress(orjson.JSONDecodeError, TypeError):
            body = orjson.loads(exc.body) if exc.body else None
        reason = body.get("message") if isinstance(body, Mapping) else exc.reason
        message = f"{what}: HTTP {exc.status}: {reason}"
        return classify_status(int(exc.status or 0), message, retry_after_of(exc.headers, body))
    return KubeTransientError(f"{what}: {type(exc).__name__}: {exc}")


# -- full-jitter back-off ------------------------------------------------------------------------------


class Backoff:
    """Full jitter (AWS architecture blog): uniform(0, min(cap, base · 2^attempt)) seconds."""

    def __init__(self, base: float, cap: float, rng: Callable[[], float] = random.random) -> None:
        self.base = base
        self.cap = cap
        self.rng = rng
        self.attempt = 0

    def next(self, retry_after: float | None = None) -> float:
        ceiling = min(self.cap, self.base * 2.0 ** min(self.attempt, 32))
        self.attempt += 1
        return max(self.rng() * ceiling, retry_after or 0.0)

    def reset(self) -> None:
        self.attempt = 0


# -- the API ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Page:
    items: list[Any]  # raw JSON objects, or their bytes (decoded by the fast path, `producer/slim.py`)
    resource_version: str  # of the list snapshot (every page of one list carries the same)
    last: bool


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: str  # ADDED, MODIFIED, DELETED, BOOKMARK
    object: dict[str, Any]
    resource_version: str
    typed: Typed | None = None  # already typed by the fast path (`object` is then empty)


def _one_line(exc: BaseException) -> str:
    """An exception as one line (YAML errors span several)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def api_client(kubeconfig: str | None = None, context: str | None = None) -> k8s.ApiClient:
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
    # One connection per concurrent watch, plus lists and the election lease.
    cfg.connection_pool_maxsize = 16
    # No urllib3 retries: they would sleep out a Retry-After uninterruptibly and uncounted.  Every
    # retry is the Reflector's (or the elector's), with full-jitter back-off and a stop check.
    cfg.retries = False
    return k8s.ApiClient(cfg)


class KubeApi:
    """List and watch calls as raw requests over the official client's configuration and pool
    (`kubeio.http`), bodies read with msgspec or orjson (never models).  Not the generated API classes:
    `CoreV1Api` alone is a 63,000-line module whose import took 0.37 s and ~20 MiB of the watcher's
    resident memory (325 against 345–353 MiB peak after a 150k-pod list), for two of its methods.

    Calico's kinds are read in `calico`, the configured group, else the one the server's `/apis` says
    (`shared.calicogroup.choose`, asked once, at the first Calico call: a failure is raised to that
    call's retry, never guessed)."""

    def __init__(
        self,
        client: k8s.ApiClient,
        *,
        calico: CalicoGroup | None = None,
        page_size: int = 500,
        watch_timeout: int = 300,
        read_margin: float = 30.0,
        connect_timeout: float = 10.0,
        list_timeout: float = 60.0,
        gulp: float = 0.25,
    ) -> None:
        self.http = Http(client, timeout=(connect_timeout, list_timeout))
        self._calico = calico
        self._calico_lock = threading.Lock()
        if calico is not None:
            log.info("Calico API group: %s (configured)", calico)
        self.gulp = gulp  # seconds a watch thread sleeps after a read that waited (`WatchStream`)
        self.page_size = page_size
        self.watch_timeout = watch_timeout
        self.read_margin = read_margin
        self.connect_timeout = connect_timeout
        self.list_timeout = list_timeout

    def calico(self) -> CalicoGroup:
        """The API group of Calico's objects (see the class docstring)."""
        with self._calico_lock:
            if self._calico is None:
                try:
                    body = self.http.request("GET", "/apis", what="discover API groups")
                    served = served_group_names(orjson.loads(body))
                except (ApiError, orjson.JSONDecodeError) as exc:
                    raise translate(exc, "discover API groups") from exc
                except ValueError as exc:
                    raise KubeTransientError(f"discover API groups: {exc}") from exc
                self._calico = choose(None, served)
                log.info("Calico API group: %s (discovered)", self._calico)
            return self._calico

    def object_kind(self, kind: Kind) -> tuple[str, str]:
        """(kind, apiVersion) of the objects of `kind`, as the server names them."""
        if kind in _CORE:
            return _CORE[kind], "v1"
        if kind in _KUBEVIRT:
            return _KUBEVIRT[kind], f"{kv.KUBEVIRT_GROUP}/{kv.KUBEVIRT_VERSION}"
        group = self.calico()
        return group.kind(kind.value), group.api_version

    def path(self, kind: Kind) -> str:
        """The collection of `kind` across namespaces (`/api/v1/pods`, `/apis/<group>/<version>/<plural>`)."""
        if kind is Kind.NODES:
            return "/api/v1/nodes"
        if kind is Kind.PODS:
            return "/api/v1/pods"
        if kind in _KUBEVIRT:  # namespaced, listed and watched across namespaces
            return f"/apis/{kv.KUBEVIRT_GROUP}/{kv.KUBEVIRT_VERSION}/{kind.value}"
        group = self.calico()
        return f"/apis/{group.name}/{group.version}/{group.plural(kind.value)}"

    def _call(
        self, kind: Kind, verb: str, query: Mapping[str, str], timeout: tuple[float, float]
    ) -> urllib3.BaseHTTPResponse:
        path = self.path(kind)
        try:
            return self.http.stream("GET", path, what=f"{verb} {kind}", query=query, timeout=timeout)
        except ApiError as exc:
            raise translate(exc, f"{verb} {kind}") from exc

    def pages(self, kind: Kind) -> Iterator[Page]:
        """A consistent list, page by page (`limit` + `continue`); 410 on an expired continue token."""
        token: str | None = None
        while True:
            query = {"limit": str(self.page_size)}
            if token:
                query["continue"] = token
            resp = self._call(kind, "list", query, (self.connect_timeout, self.list_timeout))
            try:
                data = resp.data
                fast = slim.list_page(data) if kind in FAST_KINDS else None
                body = None if fast is not None else orjson.loads(data)
            except (urllib3.exceptions.HTTPError, OSError, orjson.JSONDecodeError) as exc:
                raise translate(exc, f"list {kind}: reading the body") from exc
            finally:
                resp.release_conn()
            if fast is not None:
                items, rv_text, token = fast
                yield Page(list(items), rv_text, token is None)
                if token is None:
                    return
                continue
            if not isinstance(body, dict) or not isinstance(body.get("items") or [], list):
                raise KubeTransientError(f"list {kind}: the answer is not a list")
            meta = body.get("metadata")
            meta = meta if isinstance(meta, dict) else {}
            token = meta.get("continue") or None
            rv = meta.get("resourceVersion")
            yield Page(body.get("items") or [], rv if isinstance(rv, str) else "", token is None)
            if token is None:
                return

    def items(self, kind: Kind) -> tuple[list[dict[str, Any]], str]:
        """Every object of `kind` (all pages) and the list's resourceVersion."""
        out: list[dict[str, Any]] = []
        rv = ""
        for page in self.pages(kind):
            out.extend(_loads(i) if isinstance(i, (bytes, msgspec.Raw)) else i for i in page.items)
            rv = page.resource_version
        return out, rv

    def watch(self, kind: Kind, resource_version: str) -> WatchStream:
        """Open a watch from `resource_version`, with bookmarks and a server-side timeout randomised in
        [timeout, 2·timeout) as client-go does; the read timeout is that plus a margin."""
        timeout = int(self.watch_timeout * (1 + random.random()))
        query = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout),
        }
        resp = self._call(kind, "watch", query, (self.connect_timeout, timeout + self.read_margin))
        return WatchStream(kind, resp, gulp=self.gulp)


# A read that waited at least this long for the server found nothing buffered: the thread was asleep.
_BLOCKED_SECONDS = 0.001
# The most a watch thread takes from the socket in one read (a /26 IPAMBlock event is ~13 KB).
_READ_SIZE = 256 * 1024


def _raw_chunked_body(resp: urllib3.BaseHTTPResponse) -> io.BufferedIOBase | None:
    """The buffered socket under a chunked response of which nothing has been read yet, else None.

    urllib3 2 keeps http.client's response as `_fp` (private, so every assumption is checked here and any
    other shape falls back to urllib3's own reading): `chunked`, `chunk_left` still None (no chunk read),
    `fp` the socket's buffered reader.  A body with a content coding is left to urllib3 too."""
    fp = getattr(resp, "_fp", None)
    if not isinstance(fp, http.client.HTTPResponse) or not fp.chunked or fp.chunk_left is not None:
        return None
    raw = fp.fp
    if not isinstance(raw, io.BufferedReader):
        return None
    if resp.headers.get("content-encoding", "identity").lower() != "identity":
        return None
    return raw


class WatchStream:
    """One watch response, iterated as events; `abort()` from another thread ends it at once.

    Read in gulps (`gulp` seconds, `KubeApi`'s default 0.25): after a read that had to wait for the server,
    the thread sleeps for `gulp` before it reads on, so that what arrives meanwhile is read in one go from
    the socket's buffer, not with a thread wake-up per event (measured: ~60 µs of CPU per event woken, ~10
    µs read in gulps).  Events are at most `gulp` later; the watcher's batches wait 1 s anyway."""

    def __init__(self, kind: Kind, resp: urllib3.BaseHTTPResponse, *, gulp: float = 0.0) -> None:
        self.kind = kind
        self._resp = resp
        self._aborted = False
        self._gulp = gulp
        self._interrupted = threading.Event()

    def _chunks(self) -> Iterator[bytes]:
        raw = _raw_chunked_body(self._resp)
        if raw is None:  # not a fresh chunked body over http.client: urllib3 decodes it, a chunk at a time
            chunks = self._resp.stream(amt=None, decode_content=False)
            read: Callable[[], bytes | None] = lambda: next(chunks, None)  # noqa: E731
        else:
            # Whatever the socket has buffered, in one read, its chunked framing decoded in bulk
            # (`kubeio.chunked`: 38–40 µs per IPAMBlock event to read and frame, 47–48 through urllib3).
            dechunker = Dechunker()

            def read() -> bytes | None:
                while not dechunker.done:
                    data = raw.read1(_READ_SIZE)
                    if not data:
                        return None  # the server closed the connection
                    body = dechunker.feed(data)
                    if body:
                        return body
                return None

        while True:
            before = time.monotonic()
            chunk = read()
            waited = time.monotonic() - before
            if chunk is None:
                return
            yield chunk
            if self._gulp and waited >= _BLOCKED_SECONDS:
                self._interrupted.wait(self._gulp)

    def __iter__(self) -> Iterator[WatchEvent]:
        buf = bytearray()
        try:
            for chunk in self._chunks():
                buf += chunk
                start = 0
                while (end := buf.find(b"\n", start)) >= 0:
                    line = bytes(buf[start:end])
                    start = end + 1
                    if line.strip():
                        yield self._event(line)
                del buf[:start]
            if bytes(buf).strip():
                yield self._event(bytes(buf))
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            if self._aborted:
                return
            raise translate(exc, f"watch {self.kind}") from exc
        except ChunkError as exc:
            if self._aborted:
                return
            raise KubeTransientError(f"watch {self.kind}: {exc}") from exc

    def _event(self, line: bytes) -> WatchEvent:
        fast = self._fast(line)
        if fast is not None:
            return fast
        try:
            raw = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise KubeTransientError(f"watch {self.kind}: unreadable event: {exc}") from exc
        etype = raw.get("type") if isinstance(raw, dict) else None
        obj = raw.get("object") if isinstance(raw, dict) else None
        if not isinstance(etype, str) or not isinstance(obj, dict):
            raise KubeTransientError(f"watch {self.kind}: event without type or object")
        if etype == "ERROR":
            code = obj.get("code")
            status = code if isinstance(code, int) else 500
            raise classify_status(status, f"watch {self.kind}: {obj.get('message', 'error event')}")
        meta = obj.get("metadata")
        rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
        return WatchEvent(etype, obj, rv if isinstance(rv, str) else "")

    def _fast(self, line: bytes) -> WatchEvent | None:
        """A pod or block event typed straight from its bytes (`producer/slim.py`), or None."""
        if self.kind is Kind.BLOCKS:
            event = slim.block_event(line)  # envelope and object in one decode
            if event is None or event[0] not in _CHANGES or event[1] is None:
                return None
            b, rv = event[1]
            return WatchEvent(event[0], {}, rv, Typed(b.cidr_str, b))
        if self.kind is Kind.PODS:
            pod_event = slim.pod_event(line)
            if pod_event is None or pod_event[0] not in _CHANGES or pod_event[1] is None:
                return None
            p, rv = pod_event[1]
            return WatchEvent(pod_event[0], {}, rv, Typed(pod_key(p.namespace, p.name), p))
        return None

    def abort(self) -> None:
        """Interrupt a read blocked in another thread (the socket is shut down)."""
        self._aborted = True
        self._interrupted.set()
        # ValueError: urllib3 has no socket to shut down any more (the stream ended and its connection
        # was released meanwhile): nothing is blocked on it.  Seen as a crash of the watcher's thread
        # when it stopped (tests/deploy/test_rbac.py failed on it in three of eight runs in a session).
        with contextlib.suppress(OSError, AttributeError, ValueError):
            self._resp.shutdown()

    def close(self) -> None:
        self._resp.close()
        self._resp.release_conn()


# -- typing the objects ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ControllersConfig:
    """KubeControllersConfiguration: only `spec.controllers.node.leakGracePeriod` (seconds; None: unset)."""

    name: str
    leak_grace: float | None


@dataclass(frozen=True, slots=True)
class ClusterInfo:
    """ClusterInformation: only `spec.datastoreReady` (None: not set, Calico leaves readiness as it was)."""

    name: str
    datastore_ready: bool | None


@dataclass(frozen=True, slots=True)
class IpamConfigObject:
    """IPAMConfig (v1) / IPAMConfiguration (v3): only `spec.ipCooldownSeconds` (`shared.ipamconfig`)."""

    name: str
    config: IPAMConfig


@dataclass(frozen=True, slots=True)
class Typed:
    """An object as the mirror keys it.  `obj` None: keep the mirrored version (unparsable); `key` None:
    the object cannot even be identified."""

    key: str | None
    obj: object | None
    problem: MalformedObject | None = None


def _identity(raw: object) -> tuple[str, str]:
    meta = raw.get("metadata") if isinstance(raw, Mapping) else None
    if not isinstance(meta, Mapping):
        return "", ""
    ns, name = meta.get("namespace"), meta.get("name")
    return (ns if isinstance(ns, str) else "", name if isinstance(name, str) else "")


def _uid(raw: object) -> str:
    meta = raw.get("metadata") if isinstance(raw, Mapping) else None
    uid = meta.get("uid") if isinstance(meta, Mapping) else None
    return uid if isinstance(uid, str) else ""


def _block_cidr(raw: object, name: str) -> str | None:
    with contextlib.suppress(AddressError):
        return str(name_to_cidr(name))
    spec = raw.get("spec") if isinstance(raw, Mapping) else None
    cidr = spec.get("cidr") if isinstance(spec, Mapping) else None
    with contextlib.suppress(AddressError):
        return str(parse_network(cidr, strict=False)) if isinstance(cidr, str) else None
    return None


def _spec_path(kind: str, name: str, raw: Mapping[str, Any], *path: str) -> object:
    node: object = raw.get("spec")
    for step in path:
        if node is None:
            return None
        if not isinstance(node, Mapping):
            raise MalformedObject(kind, name, f"spec.{'.'.join(path)}: {step} is not inside an object")
        node = node.get(step)
    return node


def parse_controllers_config(raw: Mapping[str, Any], name: str) -> ControllersConfig:
    kind = "KubeControllersConfiguration"
    value = _spec_path(kind, name, raw, "controllers", "node", "leakGracePeriod")
    if value is None:
        return ControllersConfig(name, None)
    if not isinstance(value, str):
        raise MalformedObject(kind, name, f"leakGracePeriod is {value!r}, not a duration")
    try:
        return ControllersConfig(name, parse_duration(value))
    except ConfigError as exc:
        raise MalformedObject(kind, name, str(exc)) from exc


def parse_cluster_info(raw: Mapping[str, Any], name: str) -> ClusterInfo:
    value = _spec_path("ClusterInformation", name, raw, "datastoreReady")
    if value is not None and not isinstance(value, bool):
        raise MalformedObject("ClusterInformation", name, f"datastoreReady is {value!r}")
    return ClusterInfo(name, value)


def convert(kind: Kind, raw: object) -> Typed:
    """Type one raw object; a malformed one becomes what keeps IPs.

    - pod: a stand-in with no node and no IPs (every allocation naming it is "no pod IP yet": valid),
      or, when only an IP does not parse, the pod with its IPs unparsed (Calico decides a pod on another
      node, evicted, or finished before it parses IPs; otherwise `pod-ip-unparsable`: valid);
    - node: a stand-in that exists, labelled as being migrated (its empty blocks are never released);
    - block: nothing (the mirrored version, if any, stays);
    - KubeControllersConfiguration: an unset grace period (nothing is collected on live nodes);
    - ClusterInformation: datastore not ready (nothing is decided);
    - VirtualMachine / VirtualMachineInstance: one that exists, not owned by a VM (its IPs are valid).
    - IPAMConfig: the longest cooldown its schema allows (released IPs kept off reuse the longest).
    """
    ns, name = _identity(raw)
    try:
        if kind is Kind.PODS:
            pod = parse_pod(raw)
            return Typed(pod_key(pod.namespace, pod.name), pod)
        if kind is Kind.NODES:
            node = parse_node(raw)
            return Typed(node.name, node)
        if kind is Kind.BLOCKS:
            block = parse_block(raw)
            return Typed(block.cidr_str, block)
        if not isinstance(raw, Mapping) or not name:
            raise MalformedObject(kind.value, name, "no metadata.name")
        if kind is Kind.CONTROLLERS_CONFIG:
            return Typed(name, parse_controllers_config(raw, name))
        if kind is Kind.CLUSTER_INFO:
            return Typed(name, parse_cluster_info(raw, name))
        if kind is Kind.VMS:
            vm = kv.parse_vm(raw)
            return Typed(vm.key, vm)
        if kind is Kind.VMIS:
            vmi = kv.parse_vmi(raw)
            return Typed(vmi.key, vmi)
        if kind is Kind.IPAM_CONFIG:
            config = parse_ipam_config(raw)  # never raises: an unreadable value is the longest cooldown
            problem = None if config.problem is None else MalformedObject("IPAMConfig", name, config.problem)
            return Typed(name, IpamConfigObject(name, config), problem)
    except MalformedObject as exc:
        return _stand_in(kind, raw, ns, name, exc)
    raise ValueError(f"{kind} objects are not typed by the watcher")


FAST_KINDS = frozenset({Kind.PODS, Kind.BLOCKS})


def _loads(raw: bytes | msgspec.Raw) -> Any:
    """A list item's bytes as JSON (orjson reads a Raw through its buffer; an undecodable item is
    `None`, which `convert` names as malformed)."""
    try:
        return orjson.loads(memoryview(raw))
    except orjson.JSONDecodeError:
        return None


_CHANGES = frozenset({"ADDED", "MODIFIED", "DELETED"})


def fast_typed(kind: Kind, raw: bytes | msgspec.Raw) -> tuple[Typed, str] | None:
    """(typed object, resourceVersion) from the bytes of a pod or block, or None: use `convert`."""
    if kind is Kind.BLOCKS:
        b = slim.block(raw)
        return (Typed(b[0].cidr_str, b[0]), b[1]) if b is not None else None
    if kind is Kind.PODS:
        p = slim.pod(raw)
        return (Typed(pod_key(p[0].namespace, p[0].name), p[0]), p[1]) if p is not None else None
    return None


def typed_item(kind: Kind, raw: object) -> Typed | None:
    """A list item: bytes through the fast path (else decoded and `convert`ed); a dict: None."""
    if not isinstance(raw, (bytes, msgspec.Raw)):
        return None
    fast = fast_typed(kind, raw) if kind in FAST_KINDS else None
    return fast[0] if fast is not None else None


def _stand_in(kind: Kind, raw: object, ns: str, name: str, exc: MalformedObject) -> Typed:
    if kind is Kind.PODS and isinstance(exc, BadPodIP) and isinstance(exc.pod, Pod):
        return Typed(pod_key(exc.pod.namespace, exc.pod.name), exc.pod, exc)  # its IPs unparsed
    if kind is Kind.PODS:
        key = pod_key(ns, name) if ns and name else None
        return Typed(key, Pod(namespace=ns, name=name, uid=_uid(raw)) if key else None, exc)
    if kind is Kind.NODES:
        labels = {LABEL_NODE_NETWORK_DURING_MIGRATION: "unknown"}
        return Typed(name or None, Node(name=name, uid=_uid(raw), labels=labels) if name else None, exc)
    if kind is Kind.BLOCKS:
        return Typed(_block_cidr(raw, name) if name else None, None, exc)
    if kind is Kind.CONTROLLERS_CONFIG:
        return Typed(name or None, ControllersConfig(name, None) if name else None, exc)
    if kind in (Kind.VMS, Kind.VMIS):
        if not (ns and name):
            return Typed(None, None, exc)
        vm = kv.VirtualMachine(ns, name) if kind is Kind.VMS else kv.VirtualMachineInstance(ns, name)
        return Typed(vm.key, vm, exc)
    if kind is Kind.IPAM_CONFIG:
        longest = IPAMConfig(MAX_COOLDOWN_SECONDS, str(exc))
        return Typed(name or None, IpamConfigObject(name, longest) if name else None, exc)
    return Typed(name or None, ClusterInfo(name, False) if name else None, exc)


# -- the reflector ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Listed:
    """A complete list of `kind`: the mirror replaces its set with `objects`, keeping `keep`.  `paged`:
    the objects came before as `ListPage`s (the list ends here, `objects` is empty)."""

    kind: Kind
    objects: tuple[object, ...]
    keep: frozenset[str] | None  # mirrored keys to keep although absent; None: keep every one
    resource_version: str
    paged: bool = False


@dataclass(frozen=True, slots=True)
class ListPage:
    """One page of a list in progress (a paged reflector): mirrored as it arrives, so a cold start holds
    one page of typed objects at a time.  `first` starts a new list (an earlier unfinished one is void)."""

    kind: Kind
    objects: tuple[object, ...]
    first: bool


@dataclass(frozen=True, slots=True)
class Changed:
    """One watch event: `obj` is the new typed object, None when deleted."""

    kind: Kind
    key: str
    obj: object | None
    resource_version: str


@dataclass(frozen=True, slots=True)
class Progress:
    """A bookmark: everything of `kind` up to `resource_version` has been delivered."""

    kind: Kind
    resource_version: str


Item = Listed | ListPage | Changed | Progress


class WatchStats:
    """Thread-safe counters (`events.pods`, `relists.nodes`, `malformed.ipamblocks`, …)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def add(self, name: str, kind: str = "", n: int = 1) -> None:
        with self._lock:
            self._counts[f"{name}.{kind}" if kind else name] += n

    def get(self, name: str, kind: str = "") -> int:
        with self._lock:
            return self._counts[f"{name}.{kind}" if kind else name]

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(sorted(self._counts.items()))


_gc_lock = threading.Lock()
_gc_depth = 0
_gc_was_enabled = False


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while a page is parsed (design.md: 3× faster; parsed JSON holds no cycles)."""
    global _gc_depth, _gc_was_enabled  # noqa: PLW0603 - the collector is process-wide
    with _gc_lock:
        if _gc_depth == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_depth += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_depth -= 1
            if _gc_depth == 0 and _gc_was_enabled:
                gc.enable()


class Reflector:
    """List, then watch `kind` for ever, handing typed items to `sink` (see the module docstring)."""

    def __init__(
        self,
        api: KubeApi,
        kind: Kind,
        sink: Callable[[Item], None],
        stats: WatchStats,
        stop: threading.Event,
        backoff: Backoff,
        *,
        paged: bool = False,
    ) -> None:
        self.api = api
        self.paged = paged  # hand each page on as it arrives (`ListPage`), then a `Listed` barrier
        self.kind = kind
        self.sink = sink
        self.stats = stats
        self.stop = stop
        self.backoff = backoff
        self._stream: WatchStream | None = None
        self._lock = threading.Lock()

    def run(self) -> None:
        rv: str | None = None
        while not self.stop.is_set():
            try:
                if rv is None:
                    rv = self._list()
                rv = self._watch(rv)
            except ResourceExpired as exc:
                self.stats.add("expired", self.kind)
                log.info("%s: %s; relisting", self.kind, exc, extra={"kind": self.kind})
                if rv is None:  # the list's continue token expired: back off before listing again
                    self._wait(self.backoff.next())
                rv = None
            except TransientError as exc:
                self._failed(exc, getattr(exc, "retry_after", None), logging.WARNING)
            except PermanentError as exc:
                self._failed(exc, self.backoff.cap, logging.ERROR)

    def interrupt(self) -> None:
        """End the current watch now (the caller has set `stop`)."""
        with self._lock:
            if self._stream is not None:
                self._stream.abort()

    def _failed(self, exc: IpamgcError, retry_after: float | None, level: int) -> None:
        if self.stop.is_set():
            return
        self.stats.add("errors", self.kind)
        delay = self.backoff.next(retry_after)
        log.log(level, "%s: %s; retrying in %.1fs", self.kind, exc, delay, extra={"kind": self.kind})
        self._wait(delay)

    def _wait(self, seconds: float) -> None:
        self.stop.wait(seconds)

    def _list(self) -> str:
        objects: list[object] = []
        keep: set[str] | None = set()
        rv = ""
        first = True
        for page in self.api.pages(self.kind):
            with _gc_paused():
                for item in page.items:
                    fast = typed_item(self.kind, item)
                    if fast is not None:
                        objects.append(fast.obj)
                        continue
                    raw = _loads(item) if isinstance(item, (bytes, msgspec.Raw)) else item
                    typed = self._typed(raw)
                    if typed.obj is not None:
                        objects.append(typed.obj)
                    elif typed.key is None:
                        keep = None
                    elif keep is not None:
                        keep.add(typed.key)
            rv = page.resource_version
            if self.paged:
                self.sink(ListPage(self.kind, tuple(objects), first))
                objects, first = [], False
        self.stats.add("lists", self.kind)
        frozen = None if keep is None else frozenset(keep)
        self.sink(Listed(self.kind, tuple(objects), frozen, rv, paged=self.paged))
        self.backoff.reset()
        return rv

    def _watch(self, rv: str) -> str:
        stream = self.api.watch(self.kind, rv)
        with self._lock:
            self._stream = stream
        self.stats.add("watches", self.kind)
        try:
            if self.stop.is_set():
                return rv
            for event in stream:
                rv = event.resource_version or rv
                self.backoff.reset()
                if event.type == "BOOKMARK":
                    self.stats.add("bookmarks", self.kind)
                    self.sink(Progress(self.kind, rv))
                    continue
                self.stats.add("events", self.kind)
                item = self._changed(event, rv)
                if item is not None:
                    self.sink(item)
            return rv
        finally:
            with self._lock:
                self._stream = None
            stream.close()

    def _changed(self, event: WatchEvent, rv: str) -> Changed | None:
        typed = event.typed if event.typed is not None else self._typed(event.object)
        if typed.key is None:
            return None
        if event.type == "DELETED":
            return Changed(self.kind, typed.key, None, rv)
        if typed.obj is None:
            return None  # unparsable: the mirrored version stays
        return Changed(self.kind, typed.key, typed.obj, rv)

    def _typed(self, raw: object) -> Typed:
        typed = convert(self.kind, raw)
        if typed.problem is not None:
            self.stats.add("malformed", self.kind)
            exc = typed.problem
            log.warning(
                "malformed %s %s, %s: %s",
                exc.kind,
                exc.name or typed.key or "<unnamed>",
                "kept as it was" if typed.obj is None else "kept as a stand-in",
                exc,
                extra={"kind": self.kind, "object": typed.key or ""},
            )
        return typed


# -- one-shot inventory (ipamgc check --kubeconfig) ------------------------------------------------------


def fetch_live_inventory(
    kubeconfig: str | None,
    context: str | None = None,
    attempts: int = 3,
    kubevirt: Callable[[k8s.ApiClient], bool | None] | None = None,
    calico: CalicoGroup | None = None,
) -> list[dict[str, Any]]:
    """Every node, pod, IPAMBlock, IPAMHandle and BlockAffinity of a live cluster, read-only, as raw
    objects with `kind`/`apiVersion` set (lists omit them), ready for `shared.snapshot.build_inventory`;
    and its KubeVirt VMs and VMIs when `kubevirt` (`producer.kubevirt.discover`) says they are served.
    Calico's objects come from `calico`, else from the group the server's discovery says."""
    client = api_client(kubeconfig, context)
    try:
        api = KubeApi(client, calico=calico)
        out: list[dict[str, Any]] = []
        kinds: tuple[Kind, ...] = INVENTORY
        if kubevirt is not None and kubevirt(client):
            kinds = (*INVENTORY, Kind.VMS, Kind.VMIS)
        for kind in kinds:
            backoff = Backoff(0.5, 5.0)
            for attempt in range(attempts):
                try:
                    object_kind, api_version = api.object_kind(kind)
                    items, _ = api.items(kind)
                    break
                except TransientError:
                    if attempt == attempts - 1:
                        raise
                    time.sleep(backoff.next())
            for item in items:
                item.setdefault("kind", object_kind)
                item.setdefault("apiVersion", api_version)
            out.extend(items)
        return out
    finally:
        client.close()  # type: ignore[no-untyped-call]


def probe_cluster(
    kubeconfig: str | None,
    context: str | None = None,
    timeout: float = 5.0,
    calico: CalicoGroup | None = None,
) -> None:
    """One `limit=1` list of nodes, pods and IPAMBlocks, for `ipamgc up`'s pre-flight check: proves the
    kubeconfig loads, the API answers, the credentials may list, and Calico's CRDs are installed (in
    `calico`, else the discovered group).
    Raises ConfigError, KubePermanentError (401, 403, 404) or KubeTransientError, each one line."""
    client = api_client(kubeconfig, context)
    try:
        api = KubeApi(client, calico=calico, connect_timeout=timeout, list_timeout=timeout)
        for kind in (Kind.NODES, Kind.PODS, Kind.BLOCKS):
            resp = api._call(kind, "list", {"limit": "1"}, (timeout, timeout))
            try:
                _ = resp.data  # read the body whole: the connection goes back to the pool clean
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                raise translate(exc, f"list {kind}: reading the body") from exc
            finally:
                resp.release_conn()
    finally:
        client.close()  # type: ignore[no-untyped-call]
