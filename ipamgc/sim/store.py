"""The object store behind the simulated API server: resources, versions, history, watches.

Everything the HTTP layer serves goes through :class:`Store`, and in-process callers
(tests, workload drivers, benchmarks) use the very same methods, so both paths share one
implementation of the API server's semantics: a single global resourceVersion, optimistic
concurrency, consistent paginated snapshots, a bounded event history that expires like
etcd compaction, and filtered watches.

Stored objects are plain JSON dicts and are never mutated once stored (every write builds
a new dict), which lets lists, watch events and snapshots share them without copying.
Methods return deep copies unless called with ``copy=False`` (the HTTP layer serialises
the stored dicts directly and must not mutate them).
"""

from __future__ import annotations

import base64
import bisect
import heapq
import itertools
import logging
import random
import re
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from ipamgc.sim.selectors import (
    FieldSelector,
    LabelSelector,
    SelectorError,
    parse_field_selector,
    parse_label_selector,
)

JsonObj = dict[str, Any]
Key = tuple[str, str]  # (namespace, name); namespace is "" for cluster-scoped resources
#: ``hook(plural, event_type, old, new)`` called after every committed write, in commit order.
CommitHook = Callable[[str, str, JsonObj | None, JsonObj | None], None]

log = logging.getLogger(__name__)

CALICO_GROUP = "crd.projectcalico.org"
_POD_FIELDS = (
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
)
_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
CONTINUE_EXPIRED = (
    "The provided continue parameter is too old to display a consistent list result. You can "
    "start a new list without the continue parameter, or use the continue value from the list "
    "result."
)


@dataclass(frozen=True, slots=True)
class ResourceType:
    """One served resource, as its API group serves it.

    ``create_on_update``: PUT may create (leases); ``returns_deleted``: DELETE answers with
    the deleted object rather than a success ``Status``; ``custom``: CRD-backed (no
    strategic merge patch); ``field_labels``: extra fields selectable by fieldSelector.
    """

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()
    field_labels: tuple[str, ...] = ()
    create_on_update: bool = False
    returns_deleted: bool = True
    custom: bool = False
    dns_label_names: bool = False
    selectable: frozenset[str] = field(init=False, default=frozenset())

    def __post_init__(self) -> None:
        fields = {"metadata.name", "metadata.namespace", *self.field_labels}
        object.__setattr__(self, "selectable", frozenset(fields))

    @property
    def api_version(self) -> str:
        """``v1`` for the core group, ``group/version`` otherwise."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        """The kind of a LIST response."""
        return self.kind + "List"

    @property
    def qualified(self) -> str:
        """``plural.group`` as it appears in API error messages."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


def _calico(plural: str, kind: str) -> ResourceType:
    return ResourceType(CALICO_GROUP, "v1", plural, kind, namespaced=False, custom=True)


#: The served resources; adding one is one line.
RESOURCES: tuple[ResourceType, ...] = (
    ResourceType("", "v1", "namespaces", "Namespace", False, ("ns",), ("status",), dns_label_names=True),
    ResourceType(
        "", "v1", "nodes", "Node", False, ("no",), ("status",), ("spec.unschedulable",), returns_deleted=False
    ),
    ResourceType("", "v1", "pods", "Pod", True, ("po",), ("status",), _POD_FIELDS),
    ResourceType(
        "coordination.k8s.io", "v1", "leases", "Lease", True, create_on_update=True, returns_deleted=False
    ),
    _calico("ipamblocks", "IPAMBlock"),
    _calico("ipamhandles", "IPAMHandle"),
    _calico("blockaffinities", "BlockAffinity"),
    _calico("ipamconfigs", "IPAMConfig"),
    _calico("kubecontrollersconfigurations", "KubeControllersConfiguration"),
    _calico("clusterinformations", "ClusterInformation"),
    _calico("ippools", "IPPool"),
)


class SimApiError(Exception):
    """An API error, rendered over HTTP as a ``Status`` object with the same code/reason."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        *,
        details: JsonObj | None = None,
        retry_after: float | None = None,
        metadata: JsonObj | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details or {}
        self.retry_after = retry_after
        self.metadata = metadata or {}

    def status(self) -> JsonObj:
        """The ``Status`` object a real API server sends for this error."""
        out: JsonObj = {"kind": "Status", "apiVersion": "v1", "metadata": self.metadata}
        out.update(status="Failure", message=self.message, reason=self.reason)
        if self.details:
            out["details"] = self.details
        out["code"] = self.code
        return out

    @classmethod
    def _for(cls, code: int, reason: str, msg: str, rt: ResourceType, name: str) -> SimApiError:
        details: JsonObj = {"name": name, "kind": rt.plural}
        if rt.group:
            details["group"] = rt.group
        return cls(code, reason, msg, details=details)

    @classmethod
    def not_found(cls, rt: ResourceType, name: str) -> SimApiError:
        """404 NotFound for a named object."""
        return cls._for(404, "NotFound", f'{rt.qualified} "{name}" not found', rt, name)

    @classmethod
    def already_exists(cls, rt: ResourceType, name: str) -> SimApiError:
        """409 AlreadyExists."""
        return cls._for(409, "AlreadyExists", f'{rt.qualified} "{name}" already exists', rt, name)

    @classmethod
    def conflict(cls, rt: ResourceType, name: str, why: str) -> SimApiError:
        """409 Conflict (optimistic concurrency or precondition failure)."""
        msg = f'Operation cannot be fulfilled on {rt.qualified} "{name}": {why}'
        return cls._for(409, "Conflict", msg, rt, name)

    @classmethod
    def invalid(cls, rt: ResourceType, name: str, fld: str, why: str) -> SimApiError:
        """422 Invalid with one field cause."""
        details: JsonObj = {"name": name, "kind": rt.kind}
        if rt.group:
            details["group"] = rt.group
        details["causes"] = [{"reason": "FieldValueInvalid", "message": why, "field": fld}]
        return cls(422, "Invalid", f'{rt.kind} "{name}" is invalid: {fld}: {why}', details=details)

    @classmethod
    def bad_request(cls, message: str) -> SimApiError:
        """400 BadRequest."""
        return cls(400, "BadRequest", message)

    @classmethod
    def expired(cls, message: str, metadata: JsonObj | None = None) -> SimApiError:
        """410 Expired (a compacted resourceVersion or continue token)."""
        return cls(410, "Expired", message, metadata=metadata)


_CONFLICT = "the object has been modified; please apply your changes to the latest version and try again"


class Registry:
    """Lookup of :class:`ResourceType` by plural or by (group, version, plural)."""

    def __init__(self, resources: Iterable[ResourceType]) -> None:
        self._all = tuple(resources)
        self._by_plural = {rt.plural: rt for rt in self._all}
        self._by_gvr = {(rt.group, rt.version, rt.plural): rt for rt in self._all}
        if len(self._by_plural) != len(self._all):
            raise ValueError("resource plurals must be unique")

    def __iter__(self) -> Iterator[ResourceType]:
        return iter(self._all)

    def get(self, plural: str | ResourceType) -> ResourceType:
        """The resource for ``plural``; 404 (the server's unknown-resource error) if none."""
        if isinstance(plural, ResourceType):
            return plural
        try:
            return self._by_plural[plural]
        except KeyError:
            raise SimApiError(404, "NotFound", "the server could not find the requested resource") from None

    def lookup(self, group: str, version: str, plural: str) -> ResourceType | None:
        """The resource served at ``group/version/plural``, if any."""
        return self._by_gvr.get((group, version, plural))

    def group_versions(self) -> list[tuple[str, str]]:
        """Served (group, version) pairs in registration order ("" is the core group)."""
        return list(dict.fromkeys((rt.group, rt.version) for rt in self._all))

    def in_group_version(self, group: str, version: str) -> list[ResourceType]:
        """Resources served in one group/version."""
        return [rt for rt in self._all if rt.group == group and rt.version == version]


@dataclass(slots=True)
class Event:
    """One committed write. ``obj`` is the new state (for DELETED the last state at ``rv``)."""

    rv: int
    rt: ResourceType
    type: str
    key: Key
    obj: JsonObj
    old: JsonObj | None
    _raw: bytes | None = None

    def raw(self) -> bytes:
        """``obj`` serialised once and cached for every watcher."""
        if self._raw is None:
            self._raw = orjson.dumps(self.obj)
        return self._raw


class _Table:
    """Objects of one resource plus a lazily maintained sorted key index."""

    __slots__ = ("_added", "_removed", "_sorted", "objects")

    def __init__(self) -> None:
        self.objects: dict[Key, JsonObj] = {}
        self._sorted: list[Key] = []
        self._added: set[Key] = set()
        self._removed: set[Key] = set()

    def put(self, key: Key, obj: JsonObj) -> None:
        if key not in self.objects:
            if key in self._removed:
                self._removed.discard(key)
            else:
                self._added.add(key)
        self.objects[key] = obj

    def remove(self, key: Key) -> None:
        del self.objects[key]
        if key in self._added:
            self._added.discard(key)
        else:
            self._removed.add(key)

    def sorted_keys(self) -> list[Key]:
        """All keys sorted; the returned list is never mutated afterwards."""
        if self._removed:
            removed = self._removed
            self._sorted = [k for k in self._sorted if k not in removed]
            self._removed = set()
        if self._added:
            merged = self._sorted + sorted(self._added)
            merged.sort()  # two sorted runs: timsort merges them in linear time
            self._sorted = merged
            self._added = set()
        return self._sorted


def _ns_range(keys: list[Key], namespace: str | None) -> tuple[int, int]:
    if namespace is None:
        return 0, len(keys)
    return bisect.bisect_left(keys, (namespace,)), bisect.bisect_left(keys, (namespace + "\0",))


def _rv_of(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    return str(meta.get("resourceVersion") or "") if isinstance(meta, Mapping) else ""


def _parse_rv(value: str | None, what: str = "resource version") -> int | None:
    if value in (None, ""):
        return None
    try:
        rv = int(str(value))
    except ValueError:
        raise SimApiError.bad_request(f"invalid {what}: {value}") from None
    if rv < 0:
        raise SimApiError.bad_request(f"invalid {what}: {value}")
    return rv


def encode_continue(rv: int, key: Key) -> str:
    """A continue token in the real server's format (base64 of JSON with rv and start key)."""
    start = f"{key[0]}/{key[1]}" if key[0] else key[1]
    body = orjson.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": start + "\0"})
    return base64.urlsafe_b64encode(body).rstrip(b"=").decode()


def decode_continue(token: str, rt: ResourceType) -> tuple[int, Key]:
    """Inverse of :func:`encode_continue`; 400 BadRequest for a malformed token."""
    try:
        data = orjson.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        rv, start = int(data["rv"]), str(data["start"]).rstrip("\0")
        if data.get("v") != "meta.k8s.io/v1":
            raise ValueError("unknown version")
    except (ValueError, KeyError, TypeError) as exc:
        raise SimApiError.bad_request(f"continue key is not valid: {exc}") from None
    if rt.namespaced:
        ns, sep, name = start.partition("/")
        if not sep:
            raise SimApiError.bad_request("continue key is not valid: bad start key")
        return rv, (ns, name)
    return rv, ("", start)


def _deep_copy(obj: Any) -> Any:
    try:
        return orjson.loads(orjson.dumps(obj))
    except TypeError as exc:
        raise SimApiError.bad_request(f"object is not JSON-serialisable: {exc}") from None


# -- patches -------------------------------------------------------------------------------

#: List fields that strategic merge patch merges by a key instead of replacing.
_MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "env": "name",
    "ports": "containerPort",
    "conditions": "type",
    "ownerReferences": "uid",
    "imagePullSecrets": "name",
    "addresses": "type",
    "podIPs": "ip",
    "hostIPs": "ip",
    "hostAliases": "ip",
}
#: Primitive lists that strategic merge patch unions.
_MERGE_PRIMITIVES = frozenset({"finalizers", "podCIDRs"})


class PatchError(Exception):
    """A patch that cannot be decoded (400) or applied (422)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.reason = "BadRequest" if code == 400 else "Invalid"


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (unchanged subtrees are shared, not copied)."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _strategic_list(current: list[Any], items: list[Any], merge_key: str) -> list[Any]:
    if any(isinstance(i, dict) and i.get("$patch") == "replace" for i in items):
        return [i for i in items if not (isinstance(i, dict) and "$patch" in i)]
    out = list(current)
    for item in items:
        if not isinstance(item, dict) or merge_key not in item:
            out.append(item)
            continue
        idx = next(
            (n for n, c in enumerate(out) if isinstance(c, dict) and c.get(merge_key) == item[merge_key]),
            None,
        )
        if item.get("$patch") == "delete":
            if idx is not None:
                del out[idx]
        elif idx is None:
            out.append(strategic_merge_patch({}, item))
        else:
            out[idx] = strategic_merge_patch(out[idx], item)
    return out


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Strategic merge patch for built-in types: merge patch plus keyed list merging."""
    if not isinstance(patch, dict):
        return patch
    if patch.get("$patch") == "replace":
        return {k: v for k, v in patch.items() if k != "$patch"}
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        cur = result.get(key)
        if key.startswith("$deleteFromPrimitiveList/"):
            fld = key.split("/", 1)[1]
            if isinstance(result.get(fld), list) and isinstance(value, list):
                result[fld] = [x for x in result[fld] if x not in value]
        elif key.startswith("$"):
            continue
        elif value is None:
            result.pop(key, None)
        elif isinstance(value, list) and isinstance(cur, list) and key in _MERGE_KEYS:
            result[key] = _strategic_list(cur, value, _MERGE_KEYS[key])
        elif isinstance(value, list) and isinstance(cur, list) and key in _MERGE_PRIMITIVES:
            result[key] = cur + [x for x in value if x not in cur]
        elif isinstance(value, dict):
            if value.get("$patch") == "delete":
                result.pop(key, None)
            else:
                result[key] = strategic_merge_patch(cur, value)
        else:
            result[key] = value
    return result


def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise PatchError(400, f"invalid JSON pointer: {path!r}")
    return [t.replace("~1", "/").replace("~0", "~") for t in path.split("/")[1:]]


def _index(container: list[Any], token: str, path: str, *, insert: bool = False) -> int:
    if insert and token == "-":
        return len(container)
    if not token.isdigit() or (len(token) > 1 and token.startswith("0")):
        raise PatchError(422, f"invalid array index {token!r} in {path}")
    idx = int(token)
    if idx > len(container) or (idx == len(container) and not insert):
        raise PatchError(422, f"array index out of bounds: {path}")
    return idx


def _resolve(doc: Any, tokens: list[str], path: str) -> Any:
    cur = doc
    for tok in tokens:
        if isinstance(cur, dict) and tok in cur:
            cur = cur[tok]
        elif isinstance(cur, list):
            cur = cur[_index(cur, tok, path)]
        else:
            raise PatchError(422, f"doc is missing path: {path}")
    return cur


def json_patch(doc: Any, ops: Any) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, move, copy, test) on a copy of ``doc``."""
    if not isinstance(ops, list):
        raise PatchError(400, "json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    doc = _deep_copy(doc)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise PatchError(400, f"invalid JSON patch operation: {op!r}")
        kind, path = op["op"], op["path"]
        tokens = _pointer(path)
        if kind in ("add", "replace", "test") and "value" not in op:
            raise PatchError(400, f"{kind} operation requires a value: {path}")
        if kind == "test":
            if _resolve(doc, tokens, path) != op["value"]:
                raise PatchError(422, f"testing value {path} failed: test failed")
            continue
        if kind in ("move", "copy"):
            src = _pointer(op.get("from"))
            value = _deep_copy(_resolve(doc, src, op.get("from", "")))
            if kind == "move":
                doc = _remove(doc, src, op["from"])
            doc = _add(doc, tokens, path, value)
        elif kind == "add":
            doc = _add(doc, tokens, path, op["value"])
        elif kind == "remove":
            doc = _remove(doc, tokens, path)
        elif kind == "replace":
            _resolve(doc, tokens, path)
            doc = _add(_remove(doc, tokens, path), tokens, path, op["value"])
        else:
            raise PatchError(400, f"unsupported JSON patch operation: {kind!r}")
    return doc


def _add(doc: Any, tokens: list[str], path: str, value: Any) -> Any:
    if not tokens:
        return value
    parent = _resolve(doc, tokens[:-1], path)
    if isinstance(parent, dict):
        parent[tokens[-1]] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, tokens[-1], path, insert=True), value)
    else:
        raise PatchError(422, f"add operation does not apply: doc is missing path: {path}")
    return doc


def _remove(doc: Any, tokens: list[str], path: str) -> Any:
    if not tokens:
        return None
    parent = _resolve(doc, tokens[:-1], path)
    if isinstance(parent, dict) and tokens[-1] in parent:
        del parent[tokens[-1]]
    elif isinstance(parent, list):
        del parent[_index(parent, tokens[-1], path)]
    else:
        raise PatchError(422, f"remove operation does not apply: doc is missing path: {path}")
    return doc


def apply_patch(obj: JsonObj, patch: Any, patch_type: str) -> Any:
    """Apply a "merge", "strategic" or "json" patch to ``obj`` without mutating it."""
    if patch_type == "json":
        return json_patch(obj, patch)
    if not isinstance(patch, dict):
        raise PatchError(400, "a merge patch must be a JSON object")
    if patch_type == "merge":
        return merge_patch(obj, patch)
    if patch_type == "strategic":
        return strategic_merge_patch(obj, patch)
    raise PatchError(400, f"unknown patch type {patch_type!r}")


@dataclass(slots=True)
class _Filter:
    namespace: str | None
    labels: LabelSelector
    fields: FieldSelector

    def __call__(self, obj: JsonObj) -> bool:
        meta = obj.get("metadata") or {}
        if self.namespace is not None and meta.get("namespace", "") != self.namespace:
            return False
        return self.labels.matches(meta.get("labels")) and self.fields.matches(obj)


class _Snapshot:
    """Reads one resource as it was at ``rv``, in key order, a chunk per lock hold.

    Keys changed after ``rv`` are resolved from the event history: the earliest later
    event for a key carries the key's state at ``rv`` as its ``old`` object.
    """

    def __init__(self, store: Store, rt: ResourceType, rv: int, namespace: str | None) -> None:
        self._store = store
        self._table = store._tables[rt.plural]
        self._rt = rt
        self.rv = rv
        self._namespace = namespace
        self._overlay: dict[Key, JsonObj | None] = {}
        self._upto = rv

    def _refresh(self) -> None:  # lock held
        for ev in self._store._events_since(self._upto):
            if ev.rt is self._rt and ev.key not in self._overlay:
                self._overlay[ev.key] = ev.old
        self._upto = max(self._upto, self._store._rv)

    def _in_range(self, key: Key, after: Key | None) -> bool:
        ns_ok = self._namespace is None or key[0] == self._namespace
        return ns_ok and (after is None or key > after)

    def chunks(self, after: Key | None, size: int = 2000) -> Iterator[list[tuple[Key, JsonObj]]]:
        """Yield ``(key, object)`` chunks after ``after`` (exclusive) until exhausted."""
        while True:
            out: list[tuple[Key, JsonObj]] = []
            with self._store._lock:
                self._refresh()
                keys = self._table.sorted_keys()
                lo, hi = _ns_range(keys, self._namespace)
                if after is not None:
                    lo = max(lo, bisect.bisect_right(keys, after, lo, hi))
                objects, overlay = self._table.objects, self._overlay
                extras = sorted(
                    k
                    for k, v in overlay.items()
                    if v is not None and k not in objects and self._in_range(k, after)
                )
                taken = list(itertools.islice(heapq.merge(keys[lo : min(hi, lo + size)], extras), size))
                for key in taken:
                    obj = overlay[key] if key in overlay else objects.get(key)
                    if obj is not None:
                        out.append((key, obj))
            if out:
                yield out
            if len(taken) < size:
                return
            after = taken[-1]

    def count_after(self, after: Key) -> int:
        """How many objects the snapshot holds after ``after``."""
        with self._store._lock:
            self._refresh()
            keys = self._table.sorted_keys()
            lo, hi = _ns_range(keys, self._namespace)
            count = hi - max(lo, bisect.bisect_right(keys, after, lo, hi))
            for key, old in self._overlay.items():
                if self._in_range(key, after):
                    count += (old is not None) - (key in self._table.objects)
            return count


class Store:
    """Thread-safe in-memory API storage with etcd-like versioning and watch history."""

    def __init__(
        self,
        resources: Iterable[ResourceType] = RESOURCES,
        *,
        history_window: int = 10_000,
        watch_buffer: int = 250_000,
        initial_rv: int = 1,
        seed: int | None = None,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.registry = Registry(resources)
        self.history_window = history_window
        self.watch_buffer = max(watch_buffer, history_window)
        self._clock = clock or (lambda: datetime.now(UTC))
        self._rng = random.Random(seed)
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._hooks: list[CommitHook] = []
        self._tables = {rt.plural: _Table() for rt in self.registry}
        self._rv = initial_rv
        self._compacted_rv = initial_rv
        self._history: deque[Event] = deque()
        self._cursors: dict[int, int] = {}
        self._cursor_ids = itertools.count(1)

    # -- versions and history -------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        """The current global resourceVersion."""
        return self._rv

    @property
    def compacted_rv(self) -> int:
        """Versions below this are compacted: watches and continues from them get 410."""
        return self._compacted_rv

    def compact(self, rv: int | None = None) -> None:
        """Compact history up to ``rv`` (default: everything), like etcd compaction."""
        with self._lock:
            self._compacted_rv = max(self._compacted_rv, min(self._rv, rv or self._rv))
            self._trim(force=True)

    def _trim(self, force: bool = False) -> None:  # lock held
        hist = self._history
        if not hist or (not force and len(hist) <= self.history_window + 1024):
            return
        floor = self._compacted_rv
        if self._cursors:
            floor = min(floor, *self._cursors.values())
        floor = max(floor, self._rv - self.watch_buffer)
        while hist and hist[0].rv <= floor:
            hist.popleft()

    def _events_since(self, rv: int) -> list[Event]:  # lock held
        hist = self._history
        base = hist[0].rv - 1 if hist else self._rv
        if rv < base:
            raise SimApiError.expired(f"too old resource version: {rv} ({base})")
        return list(itertools.islice(hist, rv - base, None)) if rv < self._rv else []

    def _register_cursor(self, rv: int) -> int:  # lock held
        cid = next(self._cursor_ids)
        self._cursors[cid] = rv
        return cid

    def _release_cursor(self, cid: int) -> None:
        with self._lock:
            self._cursors.pop(cid, None)

    def _commit(self, rt: ResourceType, etype: str, key: Key, new: JsonObj, old: JsonObj | None) -> JsonObj:
        """Stamp ``new`` with the next resourceVersion, store it and record the event."""
        self._rv += 1
        new["metadata"]["resourceVersion"] = str(self._rv)
        table = self._tables[rt.plural]
        if etype == "DELETED":
            table.remove(key)
        else:
            table.put(key, new)
        self._history.append(Event(self._rv, rt, etype, key, new, old))
        self._compacted_rv = max(self._compacted_rv, self._rv - self.history_window)
        self._trim()
        self._cond.notify_all()
        for hook in self._hooks:
            try:
                hook(rt.plural, etype, old, new)
            except Exception:
                log.exception("store commit hook %r failed", hook)
        return new

    def add_hook(self, hook: CommitHook) -> None:
        """Call ``hook(plural, event_type, old, new)`` after every write, HTTP or in-process.

        Hooks run synchronously under the store lock, in commit order; they receive the
        stored objects (do not mutate them) and may read from the store, but should not write.
        """
        with self._lock:
            self._hooks.append(hook)

    def remove_hook(self, hook: CommitHook) -> None:
        """Stop calling ``hook``."""
        with self._lock:
            self._hooks = [h for h in self._hooks if h is not hook]

    # -- helpers ------------------------------------------------------------------------------

    def _key(self, rt: ResourceType, namespace: str | None, name: str) -> Key:
        if not rt.namespaced:
            return ("", name)
        if not namespace:
            raise SimApiError.bad_request(f"a namespace is required for {rt.qualified}")
        return (namespace, name)

    def _now(self) -> str:
        return self._clock().astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def _out(self, obj: JsonObj, copy: bool) -> JsonObj:
        return _deep_copy(obj) if copy else obj

    def _validate_name(self, rt: ResourceType, name: str) -> None:
        regex, limit = (_LABEL_RE, 63) if rt.dns_label_names else (_SUBDOMAIN_RE, 253)
        if len(name) > limit or not regex.match(name):
            what = "RFC 1123 label" if rt.dns_label_names else "RFC 1123 subdomain"
            why = (
                f'Invalid value: "{name}": a lowercase {what} must consist of lower case '
                "alphanumeric characters, '-' or '.', and must start and end with an "
                "alphanumeric character"
            )
            raise SimApiError.invalid(rt, name, "metadata.name", why)

    @staticmethod
    def _body(body: Any) -> JsonObj:
        if not isinstance(body, dict):
            raise SimApiError.bad_request("the body of the request must be a JSON object")
        obj: JsonObj = _deep_copy(body)
        if not isinstance(obj.get("metadata", {}), dict):
            raise SimApiError.bad_request("metadata must be an object")
        obj["metadata"] = dict(obj.get("metadata") or {})
        return obj

    @staticmethod
    def _spec_changed(rt: ResourceType, old: JsonObj, new: JsonObj) -> bool:
        skip = {"metadata", "status"} if "status" in rt.subresources else {"metadata"}
        keys = (set(old) | set(new)) - skip
        return any(old.get(k) != new.get(k) for k in keys)

    def _selectors(
        self, rt: ResourceType, labels: str | None, fields: str | None
    ) -> tuple[LabelSelector, FieldSelector]:
        try:
            return parse_label_selector(labels), parse_field_selector(fields, rt.selectable)
        except SelectorError as exc:
            raise SimApiError.bad_request(str(exc)) from None

    # -- reads ------------------------------------------------------------------------------

    def get(
        self, resource: str | ResourceType, namespace: str | None, name: str, *, copy: bool = True
    ) -> JsonObj:
        """GET one object; 404 if missing."""
        rt = self.registry.get(resource)
        key = self._key(rt, namespace, name)
        with self._lock:
            obj = self._tables[rt.plural].objects.get(key)
        if obj is None:
            raise SimApiError.not_found(rt, name)
        return self._out(obj, copy)

    def count(self, resource: str | ResourceType) -> int:
        """Number of stored objects of one resource."""
        rt = self.registry.get(resource)
        with self._lock:
            return len(self._tables[rt.plural].objects)

    def list(
        self,
        resource: str | ResourceType,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
        resource_version: str | None = None,
        resource_version_match: str | None = None,
        copy: bool = True,
    ) -> JsonObj:
        """LIST with selectors and limit/continue pagination over a consistent snapshot."""
        rt = self.registry.get(resource)
        labels, fields = self._selectors(rt, label_selector, field_selector)
        ns = namespace if rt.namespaced and namespace else None
        match = _Filter(None, labels, fields)
        rv_param = _parse_rv(resource_version)
        if resource_version_match not in (None, "", "Exact", "NotOlderThan"):
            raise SimApiError.bad_request(f"unsupported resourceVersionMatch: {resource_version_match}")
        after: Key | None = None
        with self._lock:
            if continue_token:
                if resource_version not in (None, ""):
                    raise SimApiError.bad_request(
                        "specifying resource version is not allowed when using continue"
                    )
                snap, after = decode_continue(continue_token, rt)
                if snap == -1:
                    snap = self._rv
                elif snap < self._compacted_rv:
                    retry = encode_continue(-1, after)
                    raise SimApiError.expired(CONTINUE_EXPIRED, {"continue": retry})
            elif resource_version_match == "Exact":
                if not rv_param:
                    raise SimApiError.bad_request(
                        "resourceVersionMatch=Exact requires a non-zero resourceVersion"
                    )
                if rv_param < self._compacted_rv:
                    raise SimApiError.expired(f"too old resource version: {rv_param} ({self._compacted_rv})")
                snap = rv_param
            else:
                snap = self._rv
            if snap > self._rv:
                raise SimApiError(
                    504,
                    "Timeout",
                    f"Too large resource version: {snap}, current resource version: {self._rv}",
                )
            cid = self._register_cursor(snap)
        items: list[JsonObj] = []
        meta: JsonObj = {"resourceVersion": str(snap)}
        try:
            reader = _Snapshot(self, rt, snap, ns)
            for chunk in reader.chunks(after, size=max(2 * (limit or 0), 2000)):
                for key, obj in chunk:
                    if limit and len(items) >= limit:
                        meta["continue"] = encode_continue(snap, after or key)
                        if labels.empty and fields.empty:
                            meta["remainingItemCount"] = reader.count_after(after or key)
                        break
                    if match(obj):
                        items.append(obj)
                    after = key
                if "continue" in meta:
                    break
        finally:
            self._release_cursor(cid)
        if copy:
            items = _deep_copy(items)
        return {"apiVersion": rt.api_version, "kind": rt.list_kind, "metadata": meta, "items": items}

    # -- writes ------------------------------------------------------------------------------

    def create(
        self,
        resource: str | ResourceType,
        namespace: str | None,
        body: Mapping[str, Any],
        *,
        dry_run: bool = False,
        copy: bool = True,
    ) -> JsonObj:
        """POST: 201 semantics; 409 AlreadyExists; 422 without name/generateName."""
        rt = self.registry.get(resource)
        obj = self._body(body)
        meta = obj["metadata"]
        if rt.namespaced:
            meta["namespace"] = namespace or meta.get("namespace") or ""
            if not meta["namespace"]:
                raise SimApiError.bad_request("namespace is required for namespaced resources")
        else:
            meta.pop("namespace", None)
        if meta.get("resourceVersion"):
            raise SimApiError(
                500, "InternalError", "resourceVersion should not be set on objects to be created"
            )
        obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
        for stale in ("deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(stale, None)
        generate = str(meta.get("generateName") or "")
        with self._lock:
            table = self._tables[rt.plural]
            name = str(meta.get("name") or "")
            if not name and generate:
                for _ in range(16):
                    suffix = "".join(self._rng.choice(_GENERATE_ALPHABET) for _ in range(5))
                    name = generate[:58] + suffix
                    if self._key(rt, meta.get("namespace"), name) not in table.objects:
                        break
            if not name:
                raise SimApiError.invalid(
                    rt, "", "metadata.name", "Required value: name or generateName is required"
                )
            self._validate_name(rt, name)
            key = self._key(rt, meta.get("namespace"), name)
            if key in table.objects:
                raise SimApiError.already_exists(rt, name)
            meta["name"] = name
            meta["uid"] = str(uuid.UUID(int=self._rng.getrandbits(128), version=4))
            meta["creationTimestamp"] = self._now()
            meta["generation"] = 1
            if dry_run:
                meta["resourceVersion"] = ""
                return self._out(obj, copy)
            return self._out(self._commit(rt, "ADDED", key, obj, None), copy)

    def replace(
        self,
        resource: str | ResourceType,
        namespace: str | None,
        name: str,
        body: Mapping[str, Any],
        *,
        subresource: str | None = None,
        dry_run: bool = False,
        copy: bool = True,
    ) -> JsonObj:
        """PUT: 404 if missing; 409 Conflict on a stale ``metadata.resourceVersion``."""
        rt = self.registry.get(resource)
        obj = self._body(body)
        with self._lock:
            return self._out(self._update(rt, namespace, name, obj, subresource, dry_run), copy)

    def patch(
        self,
        resource: str | ResourceType,
        namespace: str | None,
        name: str,
        patch: Any,
        *,
        patch_type: str = "merge",
        subresource: str | None = None,
        dry_run: bool = False,
        copy: bool = True,
    ) -> JsonObj:
        """PATCH with ``patch_type`` "merge", "strategic" or "json"; 404 if missing."""
        rt = self.registry.get(resource)
        if patch_type == "strategic" and rt.custom:
            raise SimApiError(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types include: "
                "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
            )
        ops = _deep_copy(patch)
        with self._lock:
            current = self._tables[rt.plural].objects.get(self._key(rt, namespace, name))
            if current is None:
                raise SimApiError.not_found(rt, name)
            try:
                patched = apply_patch(current, ops, patch_type)
            except PatchError as exc:
                raise SimApiError(exc.code, exc.reason, str(exc)) from None
            if not isinstance(patched, dict) or not isinstance(patched.get("metadata", {}), dict):
                raise SimApiError.bad_request("the patched object must be a JSON object")
            patched["metadata"] = dict(patched.get("metadata") or {})
            return self._out(self._update(rt, namespace, name, patched, subresource, dry_run), copy)

    def _update(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        obj: JsonObj,
        subresource: str | None,
        dry_run: bool,
    ) -> JsonObj:  # lock held
        if subresource is not None and subresource not in rt.subresources:
            raise SimApiError(404, "NotFound", "the server could not find the requested resource")
        key = self._key(rt, namespace, name)
        meta = obj["metadata"]
        if meta.get("name") and meta["name"] != name:
            raise SimApiError.bad_request(
                f"the name of the object ({meta['name']}) does not match the name on the URL ({name})"
            )
        if rt.namespaced and meta.get("namespace") and meta["namespace"] != key[0]:
            raise SimApiError.bad_request(
                "the namespace of the provided object does not match the namespace sent on the request"
            )
        table = self._tables[rt.plural]
        old = table.objects.get(key)
        want_rv = str(meta.get("resourceVersion") or "")
        if old is None:
            if rt.create_on_update and not want_rv and subresource is None:
                meta["name"] = name
                return self._create_locked(rt, key, obj, dry_run)
            raise SimApiError.not_found(rt, name)
        if want_rv:
            _parse_rv(want_rv)
            if want_rv != _rv_of(old):
                raise SimApiError.conflict(rt, name, _CONFLICT)
        old_meta = old["metadata"]
        if subresource == "status":
            new = {**old, "metadata": dict(old_meta)}
            if "status" in obj:
                new["status"] = obj["status"]
            else:
                new.pop("status", None)
        else:
            new = {**obj, "apiVersion": rt.api_version, "kind": rt.kind}
            new["metadata"] = meta
            meta["name"] = name
            if rt.namespaced:
                meta["namespace"] = key[0]
            else:
                meta.pop("namespace", None)
            for kept in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds"):
                if kept in old_meta:
                    meta[kept] = old_meta[kept]
                else:
                    meta.pop(kept, None)
            generation = int(old_meta.get("generation") or 1)
            meta["generation"] = generation + 1 if self._spec_changed(rt, old, new) else generation
        new["metadata"]["resourceVersion"] = old_meta.get("resourceVersion")
        if new == old:
            return old  # a no-op write does not bump the resourceVersion
        if dry_run:
            return new
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            return self._commit(rt, "DELETED", key, new, old)
        return self._commit(rt, "MODIFIED", key, new, old)

    def _create_locked(self, rt: ResourceType, key: Key, obj: JsonObj, dry_run: bool) -> JsonObj:
        """Create-on-update for resources that allow it (leases); the lock must be held."""
        meta = obj["metadata"]
        self._validate_name(rt, key[1])
        if rt.namespaced:
            meta["namespace"] = key[0]
        obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
        meta.pop("resourceVersion", None)
        meta["uid"] = str(uuid.UUID(int=self._rng.getrandbits(128), version=4))
        meta["creationTimestamp"] = self._now()
        meta["generation"] = 1
        if dry_run:
            return obj
        return self._commit(rt, "ADDED", key, obj, None)

    def delete(
        self,
        resource: str | ResourceType,
        namespace: str | None,
        name: str,
        *,
        preconditions: Mapping[str, Any] | None = None,
        dry_run: bool = False,
        copy: bool = True,
    ) -> JsonObj:
        """DELETE: returns the deleted object (or, with finalizers, the terminating one)."""
        rt = self.registry.get(resource)
        key = self._key(rt, namespace, name)
        with self._lock:
            old = self._tables[rt.plural].objects.get(key)
            if old is None:
                raise SimApiError.not_found(rt, name)
            meta = old["metadata"]
            pre = preconditions or {}
            if pre.get("uid") and pre["uid"] != meta.get("uid"):
                why = (
                    f"Precondition failed: UID in precondition: {pre['uid']}, "
                    f"UID in object meta: {meta.get('uid')}"
                )
                raise SimApiError.conflict(rt, name, why)
            if pre.get("resourceVersion") and str(pre["resourceVersion"]) != meta.get("resourceVersion"):
                why = (
                    f"Precondition failed: ResourceVersion in precondition: {pre['resourceVersion']}, "
                    f"ResourceVersion in object meta: {meta.get('resourceVersion')}"
                )
                raise SimApiError.conflict(rt, name, why)
            new = {**old, "metadata": dict(meta)}
            if meta.get("finalizers"):
                if meta.get("deletionTimestamp"):
                    return self._out(old, copy)
                new["metadata"]["deletionTimestamp"] = self._now()
                new["metadata"]["deletionGracePeriodSeconds"] = 0
                etype = "MODIFIED"
            else:
                etype = "DELETED"
            if dry_run:
                return self._out(new, copy)
            return self._out(self._commit(rt, etype, key, new, old), copy)

    # -- watches ----------------------------------------------------------------------------

    def watch(
        self,
        resource: str | ResourceType,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        resource_version: str | None = None,
    ) -> Watcher:
        """Open a watch. With no resourceVersion (or "0") the current state comes first.

        Raises a 410 Expired :class:`SimApiError` when ``resource_version`` is compacted.
        """
        rt = self.registry.get(resource)
        labels, fields = self._selectors(rt, label_selector, field_selector)
        rv = _parse_rv(resource_version)
        ns = namespace if rt.namespaced and namespace else None
        with self._lock:
            if rv and rv < self._compacted_rv:
                raise SimApiError.expired(f"too old resource version: {rv} ({self._compacted_rv})")
            start = rv or self._rv
            cid = self._register_cursor(start)
        return Watcher(self, rt, _Filter(ns, labels, fields), start, cid, initial=not rv)


class Watcher:
    """One watch: optional initial state, then filtered events read from the history."""

    def __init__(
        self, store: Store, rt: ResourceType, match: _Filter, rv: int, cid: int, *, initial: bool
    ) -> None:
        self.store = store
        self.rt = rt
        self.cursor = rv
        self.wants_initial = initial
        self._match = match
        self._cid = cid
        self._cancelled = False

    @property
    def cancelled(self) -> bool:
        """Whether :meth:`cancel` was called."""
        return self._cancelled

    def initial_objects(self, chunk: int = 500) -> Iterator[list[JsonObj]]:
        """The state at the watch's start version, as chunks of matching stored objects."""
        reader = _Snapshot(self.store, self.rt, self.cursor, self._match.namespace)
        for part in reader.chunks(None, size=chunk):
            objs = [obj for _, obj in part if self._match(obj)]
            if objs:
                yield objs

    def poll(self, timeout: float | None) -> list[tuple[str, Event]]:
        """Wait up to ``timeout`` for events after the cursor; 410 if they were trimmed."""
        store = self.store
        with store._cond:
            if store._rv <= self.cursor and not self._cancelled:
                store._cond.wait(timeout)
            if self._cancelled:
                return []
            events = store._events_since(self.cursor)
            if events:
                self.cursor = events[-1].rv
                store._cursors[self._cid] = self.cursor
        out: list[tuple[str, Event]] = []
        plural, match = self.rt.plural, self._match
        for ev in events:
            if ev.rt.plural != plural:
                continue
            if ev.type == "MODIFIED":
                was = ev.old is not None and match(ev.old)
                now = match(ev.obj)
                if was or now:
                    out.append(("MODIFIED" if was and now else "ADDED" if now else "DELETED", ev))
            elif match(ev.obj):
                out.append((ev.type, ev))
        return out

    def cancel(self) -> None:
        """Wake a blocked :meth:`poll` and make further polls return nothing."""
        with self.store._cond:
            self._cancelled = True
            self.store._cond.notify_all()

    def close(self) -> None:
        """Release the watch's hold on the event history."""
        self._cancelled = True
        self.store._release_cursor(self._cid)

    def __enter__(self) -> Watcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
