"""The simulated API server's DELETE: graceful pod deletion, finalizers, and the namespace controller's part.

Why a module of its own: a DELETE is the one verb with a life after the request.  A pod goes gracefully
(Kubernetes' pod strategy: a ``deletionTimestamp`` set ahead, shortened by a later DELETE, then MODIFIED
and DELETED), an object with finalizers stays until the last one goes, a half-deleted object is finished,
and a Namespace takes everything in it along (the namespace controller, done at once here).  None of that
is shared with create, update or patch (:mod:`lab.apiserver.store`), so it lives here as
:class:`DeletingStorage`, which ``Store`` extends: the verb stays a method of the same object, under the
same lock, committing through :class:`~lab.apiserver.storage.VersionedStorage` as the other verbs do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lab.apiserver import lifecycle
from lab.apiserver.resources import JsonObj, Key, ResourceType, SimApiError
from lab.apiserver.storage import VersionedStorage

__all__ = ["DeletingStorage"]


class DeletingStorage(VersionedStorage):
    """:class:`~lab.apiserver.storage.VersionedStorage` with the DELETE verb (see the module docstring)."""

    def delete(
        self,
        resource: str | ResourceType,
        namespace: str | None,
        name: str,
        *,
        preconditions: Mapping[str, Any] | None = None,
        grace_period_seconds: int | None = None,
        dry_run: bool = False,
        copy: bool = True,
    ) -> JsonObj:
        """DELETE: returns the deleted object, or the one still being deleted.

        As the real server: a pod is deleted gracefully (Kubernetes' pod strategy,
        `lifecycle.deletion_grace`): its ``deletionTimestamp`` set ``grace_period_seconds`` ahead
        (default: its ``terminationGracePeriodSeconds``) and kept until a DELETE with a shorter grace,
        0 being the kubelet's confirmation; even then a pod goes in two events, MODIFIED
        (``deletionTimestamp``, grace 0) then DELETED.  An object with finalizers is kept with a
        ``deletionTimestamp`` until the last one is removed; every other object goes at once.  Marking
        an object for deletion bumps its ``generation``.  A Namespace goes through the namespace
        controller's part at once (`_delete_namespace`).
        """
        rt = self.registry.get(resource)
        key = self._key(rt, namespace, name)
        with self._lock:
            old = self._tables[rt.plural].objects.get(key)
            if old is None:
                raise SimApiError.not_found(rt, name)
            meta = old["metadata"]
            lifecycle.check_delete_preconditions(rt, name, meta, preconditions)
            if rt.plural == "namespaces" and not dry_run:
                return self._out(self._delete_namespace(rt, key, old), copy)
            graceful = rt.plural == "pods"
            finalizers = bool(meta.get("finalizers"))
            held = meta.get("deletionGracePeriodSeconds")
            if meta.get("deletionTimestamp"):
                # already being deleted: only a shorter grace period changes anything
                if held not in (None, 0) and graceful and grace_period_seconds is not None:
                    if grace_period_seconds >= held:
                        return self._out(old, copy)
                    period = max(grace_period_seconds, 0)
                    at = self._shifted(str(meta["deletionTimestamp"]), period - int(held))
                    new = {
                        **old,
                        "metadata": {**meta, "deletionTimestamp": at, "deletionGracePeriodSeconds": period},
                    }
                elif held in (None, 0) and not finalizers:
                    new = old  # left half-deleted (the real server's recovery): delete it now
                    period = 0
                else:
                    return self._out(old, copy)
            elif graceful or finalizers:
                period = lifecycle.deletion_grace(old, grace_period_seconds) if graceful else 0
                generation = int(meta.get("generation") or 0)
                new_meta = {
                    **meta,
                    "deletionTimestamp": self._now(period),
                    "deletionGracePeriodSeconds": period,
                }
                if generation:
                    new_meta["generation"] = generation + 1
                new = {**old, "metadata": new_meta}
            else:
                if dry_run:
                    return self._out(old, copy)
                return self._out(self._commit(rt, "DELETED", key, {**old, "metadata": dict(meta)}, old), copy)
            if dry_run:
                return self._out(new, copy)
            current = old
            if new is not old:
                current = self._commit(rt, "MODIFIED", key, new, old)
            if period == 0 and not finalizers:
                gone = {**current, "metadata": dict(current["metadata"])}
                return self._out(self._commit(rt, "DELETED", key, gone, current), copy)
            return self._out(current, copy)

    def _delete_namespace(self, rt: ResourceType, key: Key, old: JsonObj) -> JsonObj:  # lock held
        """A Namespace's DELETE with the namespace controller's part done at once: marked Terminating,
        every namespaced object in it deleted (pods at grace 0: no kubelet runs here), then the
        Namespace itself."""
        ns = key[1]
        terminating = old
        if not old["metadata"].get("deletionTimestamp"):
            meta = {**old["metadata"], "deletionTimestamp": self._now(), "deletionGracePeriodSeconds": 0}
            marked = {**old, "metadata": meta, "status": {"phase": "Terminating"}}
            terminating = self._commit(rt, "MODIFIED", key, marked, old)
        held = False
        for content in list(self.registry):
            if not content.namespaced:
                continue
            for obj_key in [k for k in self._tables[content.plural].objects if k[0] == ns]:
                obj = self._tables[content.plural].objects[obj_key]
                if obj["metadata"].get("finalizers"):
                    held = True  # held by its finalizers: so is the namespace, Terminating
                    continue
                self.delete(content, ns, obj_key[1], grace_period_seconds=0, copy=False)
        if held:
            return terminating
        gone = {**terminating, "metadata": dict(terminating["metadata"])}
        return self._commit(rt, "DELETED", key, gone, terminating)
