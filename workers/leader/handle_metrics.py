"""The handle collector's Prometheus metrics, per class: found, repaired, refused, divergent now.

Its own module so that the leader's metrics (`workers.leader.metrics.LeaderMetrics`, one per process,
which owns the registry) only hold one of these, and the collector (`workers.leader.handle_gc`, one per
term) counts into it without registering anything: a second term on the same registry must not register
the families again.
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge

from shared import metrics_names as m
from shared.consistency import HandleClass
from shared.handlegc import Action


class HandleGcMetrics:
    """`ipamgc_handle_gc_*`, label `class` (one series per class from the start, at 0)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.divergent = Gauge(
            m.HANDLE_GC_DIVERGENT,
            "IPAMHandles the handle collector found divergent at its last scan, by class.",
            ["class"],
            registry=registry,
        )
        self.found = Counter(
            m.HANDLE_GC_FOUND,
            "Divergent IPAMHandles first seen (or seen changed), by class.",
            ["class"],
            registry=registry,
        )
        self.repaired = Counter(
            m.HANDLE_GC_REPAIRED,
            "IPAMHandle repairs written (or, in a dry run, that would be), by class and action.",
            ["class", "action"],
            registry=registry,
        )
        self.refused = Counter(
            m.HANDLE_GC_REFUSED,
            "Repairs due and not written (changed live, conflict, error), by class and reason.",
            ["class", "reason"],
            registry=registry,
        )
        for cls in HandleClass:
            self.divergent.labels(cls.value)
            self.found.labels(cls.value)
        for cls, action in (
            (HandleClass.ORPHAN, Action.DELETE),
            (HandleClass.ORPHAN, Action.EMPTY),
            (HandleClass.SKEWED, Action.SET_COUNTS),
            (HandleClass.MISSING, Action.CREATE),
            (HandleClass.STUCK_DELETED, Action.DELETE),
        ):
            self.repaired.labels(cls.value, action.value)

    def scanned(self, divergent: Mapping[HandleClass, int]) -> None:
        for cls in HandleClass:
            self.divergent.labels(cls.value).set(divergent.get(cls, 0))
