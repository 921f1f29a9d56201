"""Consistent paginated LISTs: the per-resource tables, snapshot reads and continue tokens.

A real API server serves every page of a paginated LIST from the same etcd revision, so a
client that pages through a large collection while it changes still sees one consistent
state. The store does the same without copying anything: a :class:`Table` keeps each
resource's objects with a lazily sorted key index, and a :class:`Snapshot` reads a table in
key order as it was at some resourceVersion, undoing later writes from the
:class:`~lab.apiserver.history.History`. Continue tokens use the real server's format.
"""

from __future__ import annotations

import base64
import bisect
import heapq
import itertools
from collections.abc import Callable, Iterator

import orjson

from lab.apiserver.history import History
from lab.apiserver.resources import JsonObj, Key, ResourceType, SimApiError

__all__ = [
    "CONTINUE_EXPIRED",
    "Snapshot",
    "Table",
    "decode_continue",
    "encode_continue",
    "ns_range",
    "read_page",
    "snapshot_version",
]

CONTINUE_EXPIRED = (
    "The provided continue parameter is too old to display a consistent list result. You can "
    "start a new list without the continue parameter, or use the continue value from the list "
    "result."
)


class Table:
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


def ns_range(keys: list[Key], namespace: str | None) -> tuple[int, int]:
    if namespace is None:
        return 0, len(keys)
    return bisect.bisect_left(keys, (namespace,)), bisect.bisect_left(keys, (namespace + "\0",))


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


class Snapshot:
    """Reads one resource as it was at ``rv``, in key order, a chunk per lock hold.

    Keys changed after ``rv`` are resolved from the event history: the earliest later
    event for a key carries the key's state at ``rv`` as its ``old`` object.
    """

    def __init__(
        self, history: History, table: Table, rt: ResourceType, rv: int, namespace: str | None
    ) -> None:
        self._history = history
        self._table = table
        self._rt = rt
        self.rv = rv
        self._namespace = namespace
        self._overlay: dict[Key, JsonObj | None] = {}
        self._upto = rv

    def _refresh(self) -> None:  # lock held
        for ev in self._history.since(self._upto):
            if ev.rt is self._rt and ev.key not in self._overlay:
                self._overlay[ev.key] = ev.old
        self._upto = max(self._upto, self._history.rv)

    def _in_range(self, key: Key, after: Key | None) -> bool:
        ns_ok = self._namespace is None or key[0] == self._namespace
        return ns_ok and (after is None or key > after)

    def chunks(self, after: Key | None, size: int = 2000) -> Iterator[list[tuple[Key, JsonObj]]]:
        """Yield ``(key, object)`` chunks after ``after`` (exclusive) until exhausted."""
        while True:
            out: list[tuple[Key, JsonObj]] = []
            with self._history.lock:
                self._refresh()
                keys = self._table.sorted_keys()
                lo, hi = ns_range(keys, self._namespace)
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
        with self._history.lock:
            self._refresh()
            keys = self._table.sorted_keys()
            lo, hi = ns_range(keys, self._namespace)
            count = hi - max(lo, bisect.bisect_right(keys, after, lo, hi))
            for key, old in self._overlay.items():
                if self._in_range(key, after):
                    count += (old is not None) - (key in self._table.objects)
            return count


def snapshot_version(
    history: History,
    rt: ResourceType,
    continue_token: str | None,
    resource_version: str | None,
    rv_param: int | None,
    resource_version_match: str | None,
) -> tuple[int, Key | None]:
    """The version a LIST page reads and the key it resumes after (lock held).

    A continue token carries both; ``resourceVersionMatch=Exact`` reads at the given
    version; anything else reads the latest. 410 Expired for a compacted version.
    """
    after: Key | None = None
    if continue_token:
        if resource_version not in (None, ""):
            raise SimApiError.bad_request("specifying resource version is not allowed when using continue")
        snap, after = decode_continue(continue_token, rt)
        if snap == -1:
            snap = history.rv
        elif snap < history.compacted_rv:
            retry = encode_continue(-1, after)
            raise SimApiError.expired(CONTINUE_EXPIRED, {"continue": retry})
    elif resource_version_match == "Exact":
        if not rv_param:
            raise SimApiError.bad_request("resourceVersionMatch=Exact requires a non-zero resourceVersion")
        if rv_param < history.compacted_rv:
            raise SimApiError.expired(f"too old resource version: {rv_param} ({history.compacted_rv})")
        snap = rv_param
    else:
        snap = history.rv
    if snap > history.rv:
        raise SimApiError(
            504,
            "Timeout",
            f"Too large resource version: {snap}, current resource version: {history.rv}",
        )
    return snap, after


def read_page(
    reader: Snapshot,
    after: Key | None,
    limit: int | None,
    match: Callable[[JsonObj], bool],
    *,
    count_remaining: bool,
) -> tuple[list[JsonObj], JsonObj]:
    """One LIST page from ``reader`` after ``after``: the matching items and the list metadata.

    A full page gets a continue token (and, if ``count_remaining``, the remaining count).
    """
    snap = reader.rv
    items: list[JsonObj] = []
    meta: JsonObj = {"resourceVersion": str(snap)}
    for chunk in reader.chunks(after, size=max(2 * (limit or 0), 2000)):
        for key, obj in chunk:
            if limit and len(items) >= limit:
                meta["continue"] = encode_continue(snap, after or key)
                if count_remaining:
                    meta["remainingItemCount"] = reader.count_after(after or key)
                break
            if match(obj):
                items.append(obj)
            after = key
        if "continue" in meta:
            break
    return items, meta
