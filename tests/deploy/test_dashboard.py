"""The Grafana dashboard is built on metrics that exist: every series a panel queries is one ipamgc exposes
(`shared/metrics_names.py`, with the suffixes prometheus-client gives counters and histograms) or one of
rq-exporter's, and it is shipped by the kustomization."""

from __future__ import annotations

import json
import re
from typing import Any

from shared import metrics_names as m
from tests.deploy.conftest import DEPLOY, kustomization

DASHBOARD = DEPLOY / "grafana" / "ipamgc-dashboard.json"
SERIES = re.compile(r"\b((?:ipamgc|ipam|rq)_[a-z_]+)\b")
COUNTERS = {
    m.WATCH_EVENTS, m.WATCH_LISTS, m.WATCH_RELISTS, m.WATCH_ERRORS, m.WATCH_EXPIRED, m.WATCH_MALFORMED,
    m.WATCHER_BATCHES, m.WATCHER_PUBLISHED, m.WATCHER_ENQUEUED, m.WATCHER_RESYNCS, m.WATCHER_REDIS_ERRORS,
    m.VALIDATED, m.DECISIONS, m.RELEASES,
}  # fmt: skip
RQ_EXPORTER = {"rq_workers", "rq_jobs", "rq_workers_success", "rq_workers_failed", "rq_workers_working_time"}


def exposed_series() -> set[str]:
    out: set[str] = set()
    for name in m.EXPOSED:
        if name in COUNTERS:
            out.add(f"{name}_total")
        elif name == m.VALIDATION_BATCH_SECONDS:
            out |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
        else:
            out.add(name)  # gauges, and Calico's reclamations (untyped, under Calico's exact name)
    return out


def targets(dash: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]


def test_every_query_uses_series_that_exist() -> None:
    dash = json.loads(DASHBOARD.read_text())
    exprs = targets(dash)
    assert len(exprs) >= 20
    known = exposed_series() | RQ_EXPORTER
    used = {s for e in exprs for s in SERIES.findall(e)}
    assert used - known == set()
    for name in (m.IPAM_IN_USE, m.IPAM_GC_CANDIDATES, m.IPAM_GC_RECLAMATIONS, m.SHARD_DIRTY, m.LEADER_EPOCH):
        assert any(name in e for e in exprs), name


def test_the_dashboard_is_importable_and_shipped() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] == "ipamgc" and dash["schemaVersion"] >= 36
    [var] = dash["templating"]["list"]
    assert var["type"] == "datasource" and var["query"] == "prometheus"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}"
    [gen] = kustomization()["configMapGenerator"]
    assert gen["files"] == ["grafana/ipamgc-dashboard.json"]


def test_panels_show_ipamgcs_own_api_requests() -> None:
    """rest_client_* is client-go's name, exported by other programs too: the panels keep ipamgc's pods."""
    exprs = [e for e in targets(json.loads(DASHBOARD.read_text())) if "rest_client_" in e]
    assert any(f"{m.REST_REQUESTS}_total" in e and "429" in e for e in exprs)
    assert any(f"{m.REST_DURATION}_bucket" in e for e in exprs)
    assert len(exprs) >= 3 and all("ipamgc_build_info" in e for e in exprs)
