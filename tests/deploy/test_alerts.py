"""ipamgc's alert rules, offline: one source (deploy/prometheus/ipamgc-rules.yaml) that compose's Prometheus
loads, the kustomize PrometheusRule equals and the Helm chart reads through its files/ link; every
expression names only metrics ipamgc exports (shared/metrics_names.py); every alert links a runbook section
that exists and is unit-tested firing and not firing.  promtool itself (`check rules`, `test rules`) runs in
.ci/deploy-checks, and here too when it has been built (tests/deploy/tools.py)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from shared import metrics_names as m
from tests.deploy.conftest import COMPOSE, DEPLOY, ROOT
from tests.deploy.prometheusrule import PROMETHEUS_RULE, RULES, prometheus_rule, render
from tests.deploy.tools import tool

RULE_TESTS = Path(__file__).parent / "alerts" / "ipamgc-rules.test.yaml"
RUNBOOKS = ROOT / "docs" / "runbooks.md"
# What pages an operator (critical) and what opens a ticket (warning): issue 45.
PAGES = {"IpamgcLeaksNotReleased", "IpamgcIPPoolExhaustionPredicted", "IpamgcTwoLeaders"}
TICKETS = {
    "IpamgcIPPoolNearlyExhausted",
    "IpamgcNoActiveWatcher",
    "IpamgcNoActiveLeader",
    "IpamgcNoLiveWorker",
    "IpamgcRedisUnreachable",
    "IpamgcRedisMemoryHigh",
    "IpamgcWatcherNotSynced",
    "IpamgcWatchFailing",
    "IpamgcAPIRequestsFailing",
    "IpamgcResyncStale",
    "IpamgcShardBacklogGrowing",
    "IpamgcLeaderReleaseErrors",
    "IpamgcLeaderRefusingReleases",
    "IpamgcNotScraped",
}
EXPECTED = PAGES | TICKETS
# The one group with absent(): rendered only where scraping is known to be configured.
SCRAPE_GROUP = "ipamgc-scrape"
PROMQL_WORDS = {
    "sum", "max", "by", "on", "and", "or", "unless", "absent", "deriv", "increase", "rate", "time",
    "without", "group_left", "bool", "group", "label_replace", "predict_linear",
}  # fmt: skip


def _rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def _exported() -> set[str]:
    """Every series name ipamgc serves: counters with `_total`, histograms with their suffixes."""
    out = set()
    for name in m.EXPOSED:
        out |= {name, f"{name}_total", f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return out


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")


def test_the_rules_are_the_alerts_issue_45_asks_for() -> None:
    assert {r["alert"] for r in _rules()} == EXPECTED
    for r in _rules():
        severity = "critical" if r["alert"] in PAGES else "warning"
        assert r["labels"] == {"severity": severity}, r["alert"]
        assert {"summary", "description", "runbook_url"} <= set(r["annotations"]), r["alert"]
        assert re.fullmatch(r"\d+m", r["for"]), r["alert"]


def test_absent_only_in_the_scrape_group_and_every_sum_grouped_by_cluster() -> None:
    """absent() fires when nothing is scraped: only in the group the chart renders with its PodMonitor.
    Every aggregation keeps `cluster` (a Prometheus of several clusters alerts per cluster), and every
    sum/max over ipamgc's series first takes one series per target (a pod scraped by two jobs)."""
    doc = yaml.safe_load(RULES.read_text())
    for group in doc["groups"]:
        for r in group["rules"]:
            has_absent = "absent(" in r["expr"]
            assert has_absent == (group["name"] == SCRAPE_GROUP), r["alert"]
            if has_absent:
                continue
            aggregations = re.findall(r"\b(sum|max|group) by \(([^)]*)\)", r["expr"])
            assert aggregations, r["alert"]
            for _, labels in aggregations:
                assert "cluster" in [x.strip() for x in labels.split(",")], (r["alert"], labels)
            assert "sum(" not in r["expr"].replace(" ", ""), r["alert"]


def test_every_expression_reads_metrics_ipamgc_exports() -> None:
    exported = _exported()
    for r in _rules():
        expr = re.sub(r'"[^"]*"', '""', r["expr"])  # label values
        expr = re.sub(r"\{[^}]*\}", "", expr)  # matchers
        expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges
        expr = re.sub(r"\b(by|on|without|ignoring|group_left)\s*\([^)]*\)", "", expr)  # label lists
        names = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr)) - PROMQL_WORDS
        assert names, r["alert"]
        assert names <= exported, (r["alert"], names - exported)


def test_every_alert_links_a_runbook_section_that_exists() -> None:
    headings = {_anchor(h) for h in re.findall(r"^#+ (.+)$", RUNBOOKS.read_text(), re.MULTILINE)}
    for r in _rules():
        path, _, anchor = r["annotations"]["runbook_url"].partition("#")
        assert path == "docs/runbooks.md", r["alert"]
        assert anchor == r["alert"].lower() and anchor in headings, r["alert"]


def test_every_alert_is_unit_tested_firing_and_not_firing() -> None:
    doc = yaml.safe_load(RULE_TESTS.read_text())
    assert [str((RULE_TESTS.parent / f).resolve()) for f in doc["rule_files"]] == [str(RULES.resolve())]
    fired: set[str] = set()
    quiet: set[str] = set()
    for test in doc["tests"]:
        for case in test.get("alert_rule_test", []):
            (fired if case["exp_alerts"] else quiet).add(case["alertname"])
    assert fired == EXPECTED, EXPECTED - fired
    assert quiet == EXPECTED, EXPECTED - quiet


def test_the_kustomize_prometheus_rule_is_generated_from_the_rules_file() -> None:
    assert PROMETHEUS_RULE.read_text() == render(), "run: .venv/bin/python -m tests.deploy.prometheusrule"
    generated = yaml.safe_load(PROMETHEUS_RULE.read_text())
    assert generated == prometheus_rule(yaml.safe_load(RULES.read_text()))
    component = PROMETHEUS_RULE.parent / "kustomization.yaml"
    assert PROMETHEUS_RULE.name in yaml.safe_load(component.read_text())["resources"]


def test_the_chart_reads_the_same_file() -> None:
    link = DEPLOY / "helm" / "ipamgc" / "files" / "ipamgc-rules.yaml"
    assert link.is_symlink() and link.resolve() == RULES.resolve()


def test_compose_prometheus_loads_the_rules_file() -> None:
    prom = yaml.safe_load((COMPOSE / "prometheus.yml").read_text())
    compose = yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())
    [rule_file] = prom["rule_files"]
    mounts = {}
    for volume in compose["services"]["prometheus"]["volumes"]:
        source, _, target = volume.partition(":")
        mounts[target.removesuffix(":ro")] = source
    assert (COMPOSE / mounts[rule_file]).resolve() == RULES.resolve()


def test_promtool_checks_and_unit_tests_the_rules() -> None:
    promtool = tool("promtool")
    for args in (["check", "rules", str(RULES)], ["test", "rules", str(RULE_TESTS)]):
        done = subprocess.run([promtool, *args], check=False, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_fails_a_rule_test_that_does_not_hold(tmp_path: Path) -> None:
    """The unit tests can fail: the same file expecting no alert where one fires is refused."""
    promtool = tool("promtool")
    doc = yaml.safe_load(RULE_TESTS.read_text())
    doc["rule_files"] = [str(RULES)]
    [case] = [c for t in doc["tests"] for c in t["alert_rule_test"] if c["exp_alerts"]][:1]
    case["exp_alerts"] = []
    broken = tmp_path / "broken.test.yaml"
    broken.write_text(yaml.safe_dump(doc))
    args = [promtool, "test", "rules", str(broken)]
    done = subprocess.run(args, check=False, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert case["alertname"] in done.stdout + done.stderr
