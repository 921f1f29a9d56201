"""The storage under the simulated API server's verbs: versioned tables, commits in order, commit hooks.

Why a module of its own: :class:`~lab.apiserver.store.Store` is two things.  Its verbs decide what a
request means (names, preconditions, the object lifecycle, selectors, pagination); underneath, something
must keep the objects, hand out the one global resourceVersion, record every write in the history that
lists and watches read (:mod:`.history`), and tell the commit hooks, in commit order.  That second part
decides nothing, so it lives here as :class:`VersionedStorage`, which ``Store`` extends: a commit stays
one method call on the same object (no wrapper on the write path, which every request and every
simulated kubelet and CNI write takes).
"""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta

from lab.apiserver import lifecycle, resources
from lab.apiserver.history import Event, History
from lab.apiserver.listing import Table
from lab.apiserver.resources import (
    CRD_RESOURCE,
    RESOURCES,
    JsonObj,
    Key,
    Registry,
    ResourceType,
    SimApiError,
    crd_object,
)

__all__ = ["CommitHook", "VersionedStorage"]

#: ``hook(plural, event_type, old, new)`` called after every committed write, in commit order.
CommitHook = Callable[[str, str, JsonObj | None, JsonObj | None], None]

log = logging.getLogger(__name__)

_TIMESTAMP = "%Y-%m-%dT%H:%M:%SZ"
_INSTALLED = "2026-01-01T00:00:00Z"
#: The namespaces a new cluster has.
SYSTEM_NAMESPACES = ("default", "kube-node-lease", "kube-public", "kube-system")


class VersionedStorage:
    """The served resource types, a table of objects per type, the history and the commit hooks."""

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
        self._install_crds()
        self._install_namespaces()

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
            self._install_crds()

    def unserve(self, plurals: Iterable[str]) -> None:
        """Stop serving resource types, their objects gone with them (a CRD deleted)."""
        with self._lock:
            gone = set(plurals)
            self.registry = Registry(rt for rt in self.registry if rt.plural not in gone)
            for plural in gone:
                self._tables.pop(plural, None)
            self._install_crds()

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
        """Stop calling ``hook``.  Compared with ``==``: a bound method (``sim._on_commit``) is a new
        object at each access, so ``is`` never matched one and the hook kept running."""
        with self._lock:
            self._hooks = [h for h in self._hooks if h != hook]

    def _install_crds(self) -> None:
        """One CustomResourceDefinition for each served custom resource, as a real cluster holds them
        (when the store serves `customresourcedefinitions`).  They are part of the cluster as it was set
        up, stored at the initial version without events and with a uid made from the name, so serving
        them moves neither the resourceVersion nor the seeded uids of everything else."""
        table = self._tables.get(CRD_RESOURCE.plural)
        if table is None:
            return
        initial = str(self._history.compacted_rv or 1)
        wanted: dict[Key, JsonObj] = {}
        for rt in self.registry:
            if rt.custom:
                crd = crd_object(rt)
                name = crd["metadata"]["name"]
                crd["metadata"].update(
                    uid=str(uuid.uuid5(uuid.NAMESPACE_URL, name)),
                    resourceVersion=initial,
                    generation=1,
                    creationTimestamp="2026-01-01T00:00:00Z",
                )
                wanted[("", name)] = crd
        for key in [k for k in table.objects if k not in wanted]:
            table.remove(key)
        for key, crd in wanted.items():
            if key not in table.objects:
                table.put(key, crd)

    def _install_namespaces(self) -> None:
        """The namespaces every cluster starts with (``default``, ``kube-node-lease``, ``kube-public``,
        ``kube-system``) and their ServiceAccount ``default``, when the store serves them: set up like the
        CRDs, without events or seeded uids.  ``kube-system``'s uid names the cluster
        (`shared/cluster.py`): random, so that two simulated clusters of one seed are two clusters, as
        two real ones always are."""
        spaces = self._tables.get("namespaces")
        if spaces is None:
            return
        initial = str(self._history.compacted_rv or 1)
        accounts = self._tables.get("serviceaccounts")
        for name in SYSTEM_NAMESPACES:
            uid = str(uuid.uuid4() if name == "kube-system" else uuid.uuid5(uuid.NAMESPACE_URL, f"ns/{name}"))
            ns: JsonObj = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
            lifecycle.namespace_defaults(ns)
            ns["metadata"].update(
                uid=uid, resourceVersion=initial, generation=1, creationTimestamp=_INSTALLED
            )
            spaces.put(("", name), ns)
            if accounts is not None:
                sa_uid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"sa/{name}/default"))
                meta = {"name": "default", "namespace": name, "uid": sa_uid, "resourceVersion": initial}
                sa = {
                    "apiVersion": "v1",
                    "kind": "ServiceAccount",
                    "metadata": meta | {"creationTimestamp": _INSTALLED},
                }
                accounts.put((name, "default"), sa)

    # -- helpers ------------------------------------------------------------------------------

    def _key(self, rt: ResourceType, namespace: str | None, name: str) -> Key:
        if not rt.namespaced:
            return ("", name)
        if not namespace:
            raise SimApiError.bad_request(f"a namespace is required for {rt.qualified}")
        return (namespace, name)

    def _now(self, ahead: int = 0) -> str:
        """The clock's time (`ahead` seconds on), as the API server writes timestamps."""
        return (self._clock() + timedelta(seconds=ahead)).astimezone(UTC).strftime(_TIMESTAMP)

    @staticmethod
    def _shifted(stamp: str, seconds: int) -> str:
        """A timestamp the server wrote, moved by `seconds`."""
        moved = datetime.strptime(stamp, _TIMESTAMP).replace(tzinfo=UTC) + timedelta(seconds=seconds)
        return moved.strftime(_TIMESTAMP)

    def _uid(self) -> str:
        """A random (seeded) version-4 UUID, formatted directly: `uuid.UUID` costs 9 µs a call."""
        r = self._rng.getrandbits(128)
        h = f"{r:032x}"
        return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{'89ab'[r & 3]}{h[17:20]}-{h[20:]}"

    def _out(self, obj: JsonObj, copy: bool) -> JsonObj:
        return resources.deep_copy(obj) if copy else obj
