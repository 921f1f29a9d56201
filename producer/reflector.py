"""client-go's reflector for one resource: list, watch, resume, relist, back off; typed items to a sink.

Why it exists: the watcher's view of the cluster must survive everything a watch does in production —
a watch that ends (resume from the last resourceVersion seen), a resourceVersion compacted away (410:
relist), an API that fails (full-jitter back-off honouring Retry-After, every wait interruptible), an
object that cannot be read (logged with its kind and name, counted, replaced by what keeps IPs).
`Reflector.run` lists with limit/continue (each page handed on as it arrives when `paged`, so a cold start
holds one page of typed objects at a time), then watches with bookmarks, and hands `Listed`, `ListPage`,
`Changed` and `Progress` items to its sink (the watcher's queue).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import msgspec

from kubeio.errors import ResourceExpired
from kubeio.watch import Backoff, WatchEvent, WatchStream
from producer.kinds import Kind
from producer.kube import KubeApi
from producer.typed import Typed, convert, loads_item, typed_item
from shared.errors import IpamgcError, PermanentError, TransientError

log = logging.getLogger(__name__)


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
        self._relist = False  # a relist asked for (`request_relist`): the next round lists

    def run(self) -> None:
        rv: str | None = None
        while not self.stop.is_set():
            try:
                if self._relist:
                    self._relist = False
                    rv = None
                    self.stats.add("relists_requested", self.kind)
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

    def request_relist(self) -> None:
        """List again now, as after a 410 (the watcher's backstop found the mirror of this kind not what
        it wrote): the current watch ends, the list's diff writes what differs."""
        self._relist = True
        self.interrupt()

    def _failed(self, exc: IpamgcError, retry_after: float | None, level: int) -> None:
        if self.stop.is_set() or self._relist:
            return  # stopping, or the watch was ended for a relist (`request_relist`)
        self.stats.add("errors", self.kind)
        delay = self.backoff.next(retry_after)
        log.log(level, "%s: %s; retrying in %.1fs", self.kind, exc, delay, extra={"kind": self.kind})
        self._wait(delay)

    def _wait(self, seconds: float) -> None:
        self.stop.wait(seconds)

    def _take_page(self, items: Sequence[object], objects: list[object], keep: set[str] | None) -> bool:
        """Type a list page's items into `objects`; an item that types to nothing but names an object
        goes into `keep` (kept as mirrored).  False when one names nothing (then nothing is deleted)."""
        named = True
        for item in items:
            fast = typed_item(self.kind, item)
            if fast is not None:
                objects.append(fast.obj)
                continue
            raw = loads_item(item) if isinstance(item, (bytes, msgspec.Raw)) else item
            typed = self._typed(raw)
            if typed.obj is not None:
                objects.append(typed.obj)
            elif typed.key is None:
                named = False
            elif keep is not None:
                keep.add(typed.key)
        return named

    def _list(self) -> str:
        objects: list[object] = []
        keep: set[str] | None = set()
        rv = ""
        first = True
        for page in self.api.pages(self.kind, typed=True):
            with _gc_paused():
                if not self._take_page(page.items, objects, keep):
                    keep = None
            rv = page.resource_version
            del page  # its raw items hold the page's body: not kept while the next page is read
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
            if self.stop.is_set() or self._relist:
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
