"""The object store behind the simulated API server: versioned objects and their semantics.

Everything the HTTP layer serves goes through :class:`Store`, and in-process callers
(tests, workload drivers, benchmarks) use the very same methods, so both paths share one
implementation of the API server's semantics: a single global resourceVersion, optimistic
concurrency, consistent paginated snapshots, a bounded event history that expires like
etcd compaction, and filtered watches.

This module holds the verbs; their building blocks live next to it (:mod:`.resources`,
:mod:`.validation`, :mod:`.lifecycle`, :mod:`.patch`, :mod:`.history`, :mod:`.listing`,
:mod:`.watch`), and the names callers have always imported from here are re-exported.

Stored objects are plain JSON dicts and are never mutated once stored (every write builds
a new dict), which lets lists, watch events and snapshots share them without copying.
Methods return deep copies unless called with ``copy=False`` (the HTTP layer serialises
the stored dicts directly and must not mutate them).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from ipamgc.sim import lifecycle, listing, resources
from ipamgc.sim import patch as patches
from ipamgc.sim.history import Event, History
from ipamgc.sim.listing import CONTINUE_EXPIRED, Snapshot, Table, decode_continue, encode_continue
from ipamgc.sim.patch import PatchError, apply_patch, json_patch, merge_patch, strategic_merge_patch
from ipamgc.sim.resources import CALICO_GROUP, RESOURCES, JsonObj, Key, Registry, ResourceType, SimApiError
from ipamgc.sim.validation import ObjectFilter, parse_rv, parse_selectors, request_body, validate_name
from ipamgc.sim.watch import Watcher

__all__ = [
    "CALICO_GROUP",
    "CONTINUE_EXPIRED",
    "RESOURCES",
    "CommitHook",
    "Event",
    "JsonObj",
    "Key",
    "PatchError",
    "Registry",
    "ResourceType",
    "SimApiError",
    "Store",
    "Watcher",
    "apply_patch",
    "decode_continue",
    "encode_continue",
    "json_patch",
    "merge_patch",
    "strategic_merge_patch",
]

#: ``hook(plural, event_type, old, new)`` called after every committed write, in commit order.
CommitHook = Callable[[str, str, JsonObj | None, JsonObj | None], None]

log = logging.getLogger(__name__)


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
        self._history = History(initial_rv, history_window, watch_buffer)
        self._clock = clock or (lambda: datetime.now(UTC))
        self._rng = random.Random(seed)
        self._lock = self._history.lock
        self._hooks: list[CommitHook] = []
        self._tables = {rt.plural: Table() for rt in self.registry}
        #: The Calico API group this store serves (None: no Calico resources).
        self.calico = self.registry.calico_group()

    # -- versions and history -------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        """The current global resourceVersion."""
        return self._history.rv

    @property
    def compacted_rv(self) -> int:
        """Versions below this are compacted: watches and continues from them get 410."""
        return self._history.compacted_rv

    @property
    def history_window(self) -> int:
        """How many versions stay readable; older ones are compacted as writes commit."""
        return self._history.window

    @history_window.setter
    def history_window(self, value: int) -> None:
        self._history.window = value

    @property
    def watch_buffer(self) -> int:
        """How far back the history is kept for slow open watches and lists."""
        return self._history.buffer

    @watch_buffer.setter
    def watch_buffer(self, value: int) -> None:
        self._history.buffer = value

    def serve(self, resources: Iterable[ResourceType]) -> None:
        """Start serving more resource types (a CRD installed while clients run: KubeVirt added later)."""
        with self._lock:
            new = [rt for rt in resources if rt.plural not in self._tables]
            self.registry = Registry((*self.registry, *new))
            for rt in new:
                self._tables[rt.plural] = Table()

    def unserve(self, plurals: Iterable[str]) -> None:
        """Stop serving resource types, their objects gone with them (a CRD deleted)."""
        with self._lock:
            gone = set(plurals)
            self.registry = Registry(rt for rt in self.registry if rt.plural not in gone)
            for plural in gone:
                self._tables.pop(plural, None)

    def serves(self, plural: str) -> bool:
        return plural in self._tables

    def compact(self, rv: int | None = None) -> None:
        """Compact history up to ``rv`` (default: everything), like etcd compaction."""
        with self._lock:
            self._history.compact(rv)

    def _commit(self, rt: ResourceType, etype: str, key: Key, new: JsonObj, old: JsonObj | None) -> JsonObj:
        """Stamp ``new`` with the next resourceVersion, store it and record the event."""
        rv = self._history.next_rv()
        new["metadata"]["resourceVersion"] = str(rv)
        table = self._tables[rt.plural]
        if etype == "DELETED":
            table.remove(key)
        else:
            table.put(key, new)
        self._history.append(Event(rv, rt, etype, key, new, old))
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

    def _uid(self) -> str:
        """A random (seeded) version-4 UUID, formatted directly: `uuid.UUID` costs 9 µs a call."""
        r = self._rng.getrandbits(128)
        h = f"{r:032x}"
        return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{'89ab'[r & 3]}{h[17:20]}-{h[20:]}"

    def _out(self, obj: JsonObj, copy: bool) -> JsonObj:
        return resources.deep_copy(obj) if copy else obj

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
        labels, fields = parse_selectors(rt, label_selector, field_selector)
        ns = namespace if rt.namespaced and namespace else None
        match = ObjectFilter(None, labels, fields)
        rv_param = parse_rv(resource_version)
        if resource_version_match not in (None, "", "Exact", "NotOlderThan"):
            raise SimApiError.bad_request(f"unsupported resourceVersionMatch: {resource_version_match}")
        with self._lock:
            snap, after = listing.snapshot_version(
                self._history, rt, continue_token, resource_version, rv_param, resource_version_match
            )
            cid = self._history.open_cursor(snap)
        try:
            reader = Snapshot(self._history, self._tables[rt.plural], rt, snap, ns)
            everything = labels.empty and fields.empty
            items, meta = listing.read_page(reader, after, limit, match, count_remaining=everything)
        finally:
            with self._lock:
                self._history.close_cursor(cid)
        if copy:
            items = resources.deep_copy(items)
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
        """POST: 201 semantics; 409 AlreadyExists; 422 without name/generateName.

        With ``copy=False`` the store adopts ``body`` as is (the caller hands it over and must not
        touch it again) and returns the stored object itself: the bulk loaders' fast path.
        """
        rt = self.registry.get(resource)
        obj = request_body(body) if copy or not isinstance(body, dict) else _adopt(body)
        meta = obj["metadata"]
        lifecycle.prepare_create(rt, obj, namespace)
        generate = str(meta.get("generateName") or "")
        with self._lock:
            table = self._tables[rt.plural]
            name = str(meta.get("name") or "")
            if not name and generate:
                name = lifecycle.generate_name(
                    generate, self._rng, lambda n: self._key(rt, meta.get("namespace"), n) in table.objects
                )
            if not name:
                raise SimApiError.invalid(
                    rt, "", "metadata.name", "Required value: name or generateName is required"
                )
            validate_name(rt, name)
            key = self._key(rt, meta.get("namespace"), name)
            if key in table.objects:
                raise SimApiError.already_exists(rt, name)
            meta["name"] = name
            lifecycle.check_typed_fields(rt, name, obj)
            lifecycle.stamp_new(meta, self._uid(), self._now())
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
        obj = request_body(body)
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
        patches.check_patch_type(rt, patch_type)
        ops = resources.deep_copy(patch)
        with self._lock:
            current = self._tables[rt.plural].objects.get(self._key(rt, namespace, name))
            if current is None:
                raise SimApiError.not_found(rt, name)
            patched = patches.patch_object(current, ops, patch_type)
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
        lifecycle.check_update_target(rt, key, name, meta)
        table = self._tables[rt.plural]
        old = table.objects.get(key)
        want_rv = str(meta.get("resourceVersion") or "")
        if old is None:
            if rt.create_on_update and not want_rv and subresource is None:
                meta["name"] = name
                return self._create_locked(rt, key, obj, dry_run)
            raise SimApiError.not_found(rt, name)
        lifecycle.check_update_precondition(rt, name, want_rv, old)
        new = lifecycle.build_update(rt, key, name, old, obj, subresource)
        lifecycle.check_typed_fields(rt, name, new)
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
        validate_name(rt, key[1])
        if rt.namespaced:
            meta["namespace"] = key[0]
        obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
        meta.pop("resourceVersion", None)
        lifecycle.stamp_new(meta, self._uid(), self._now())
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
            lifecycle.check_delete_preconditions(rt, name, meta, preconditions)
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
        labels, fields = parse_selectors(rt, label_selector, field_selector)
        rv = parse_rv(resource_version)
        ns = namespace if rt.namespaced and namespace else None
        history = self._history
        with self._lock:
            if rv and rv < history.compacted_rv:
                raise SimApiError.expired(f"too old resource version: {rv} ({history.compacted_rv})")
            start = rv or history.rv
            cid = history.open_cursor(start)
        match = ObjectFilter(ns, labels, fields)
        table = self._tables[rt.plural]
        return Watcher(self, history, table, rt, match, start, cid, initial=not rv)


def _adopt(body: JsonObj) -> JsonObj:
    """Take a caller's body without copying it (see `Store.create`)."""
    meta = body.get("metadata")
    if not isinstance(meta, dict):
        return request_body(body)
    return body
