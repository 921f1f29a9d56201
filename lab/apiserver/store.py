"""The object store behind the simulated API server: versioned objects and their semantics.

Everything the HTTP layer serves goes through :class:`Store`, and in-process callers
(tests, workload drivers, benchmarks) use the very same methods, so both paths share one
implementation of the API server's semantics: a single global resourceVersion, optimistic
concurrency, consistent paginated snapshots, a bounded event history that expires like
etcd compaction, and filtered watches.

This module holds the verbs but DELETE (:mod:`.deletion`: graceful pods, finalizers, a namespace's
cascade); the versioned tables, the commits and their hooks they work on are
:class:`~lab.apiserver.storage.VersionedStorage`, which :class:`Store` extends (by way of
:class:`~lab.apiserver.deletion.DeletingStorage`), and their building blocks live next to it
(:mod:`.resources`, :mod:`.validation`, :mod:`.lifecycle`, :mod:`.patch`, :mod:`.history`,
:mod:`.listing`, :mod:`.watch`); the names callers have always imported from here are re-exported.

Stored objects are plain JSON dicts and are never mutated once stored (every write builds
a new dict), which lets lists, watch events and snapshots share them without copying.
Methods return deep copies unless called with ``copy=False`` (the HTTP layer serialises
the stored dicts directly and must not mutate them).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from lab.apiserver import lifecycle, listing, resources
from lab.apiserver import patch as patches
from lab.apiserver.deletion import DeletingStorage
from lab.apiserver.history import Event
from lab.apiserver.listing import CONTINUE_EXPIRED, Snapshot, decode_continue, encode_continue
from lab.apiserver.patch import PatchError, apply_patch, json_patch, merge_patch, strategic_merge_patch
from lab.apiserver.resources import CALICO_GROUP, RESOURCES, JsonObj, Key, Registry, ResourceType, SimApiError
from lab.apiserver.storage import CommitHook
from lab.apiserver.validation import ObjectFilter, parse_rv, parse_selectors, request_body, validate_name
from lab.apiserver.watch import Watcher

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


class Store(DeletingStorage):
    """Thread-safe in-memory API storage with etcd-like versioning and watch history: the verbs, over the
    versioned tables of :class:`~lab.apiserver.storage.VersionedStorage` (DELETE: `DeletingStorage`)."""

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
        uid: str | None = None,
        restore: bool = False,
        field_manager: str | None = None,
    ) -> JsonObj:
        """POST: 201 semantics; 409 AlreadyExists; 422 without name/generateName.

        As the real server's admission and create strategy: 404 in a namespace that does not exist,
        403 in one being deleted or for a pod whose service account does not exist; a new pod's status
        is reset to Pending (its IPs come with a later ``/status`` write, the kubelet's); a new
        Namespace gets its name label, the ``kubernetes`` finalizer and Active, and (the service
        account controller's part) its ServiceAccount ``default``.

        With ``copy=False`` the store adopts ``body`` as is (the caller hands it over and must not
        touch it again) and returns the stored object itself: the bulk loaders' fast path.  ``uid``:
        the object's uid instead of a seeded one (a server-side choice, never a client's).
        ``restore``: the object as a cluster restored from a backup holds it (the bulk loaders and
        snapshot loaders): no admission, the status kept.  ``field_manager``: who writes (a real
        server's ``fieldManager``, which `RestStore` sends): here the object keeps the managedFields its
        body carries, as a real server does when a create sets them.
        """
        del field_manager
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
            if not restore:
                self._admit(rt, obj)
                if rt.plural == "pods":
                    obj["status"] = {
                        "phase": "Pending",
                        "qosClass": lifecycle.pod_qos_class(obj.get("spec") or {}),
                    }
                elif rt.plural == "namespaces":
                    lifecycle.namespace_defaults(obj)
            lifecycle.stamp_new(meta, uid or self._uid(), self._now())
            if dry_run:
                meta["resourceVersion"] = ""
                return self._out(obj, copy)
            created = self._commit(rt, "ADDED", key, obj, None)
            if rt.plural == "namespaces":
                self._default_service_account(name)
            return self._out(created, copy)

    def create_many(self, resource: str, objs: Iterable[Mapping[str, Any]], **kwargs: Any) -> None:
        """Every object of `objs` created (`create`, each in the namespace its metadata names): the bulk
        loader's sweep.  Here one after another; `RestStore` keeps several requests in flight."""
        for obj in objs:
            self.create(resource, (obj.get("metadata") or {}).get("namespace"), obj, **kwargs)

    def ensure_namespace(self, name: str) -> None:
        """Namespace `name`, created unless it exists (``kubectl create namespace``, AlreadyExists
        tolerated): the actors call it before they create anything in a namespace."""
        if "namespaces" not in self._tables:
            return
        with self._lock:
            if ("", name) in self._tables["namespaces"].objects:
                return
            try:
                self.create(
                    "namespaces", None, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
                )
            except SimApiError as exc:
                if exc.code != 409:
                    raise

    def _admit(self, rt: ResourceType, obj: JsonObj) -> None:  # lock held
        """The real server's admission of a create (`lifecycle.admission_refusal`)."""
        if not rt.namespaced or "namespaces" not in self._tables:
            return
        ns = str(obj["metadata"].get("namespace") or "")
        namespace = self._tables["namespaces"].objects.get(("", ns))
        account: JsonObj | None = namespace
        if rt.plural == "pods" and namespace is not None and "serviceaccounts" in self._tables:
            account = self._tables["serviceaccounts"].objects.get((ns, lifecycle.service_account_name(obj)))
        refusal = lifecycle.admission_refusal(rt, obj, namespace, account)
        if refusal is not None:
            raise refusal

    def _default_service_account(self, namespace: str) -> None:  # lock held
        """The service account controller: every new namespace gets its ServiceAccount ``default``."""
        if "serviceaccounts" not in self._tables:
            return
        rt = self.registry.get("serviceaccounts")
        key = (namespace, "default")
        if key in self._tables["serviceaccounts"].objects:
            return
        sa: JsonObj = {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "default", "namespace": namespace},
        }
        lifecycle.stamp_new(sa["metadata"], self._uid(), self._now())
        self._commit(rt, "ADDED", key, sa, None)

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
        field_manager: str | None = None,
    ) -> JsonObj:
        """PUT: 404 if missing; 409 Conflict on a stale ``metadata.resourceVersion``.  ``field_manager``:
        as `create`'s (the managedFields stay what the body or, for a status write, the stored object
        has)."""
        del field_manager
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
        if lifecycle.should_delete_on_update(old["metadata"], new["metadata"]):
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
        self._admit(rt, obj)
        lifecycle.stamp_new(meta, self._uid(), self._now())
        if dry_run:
            return obj
        return self._commit(rt, "ADDED", key, obj, None)

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
