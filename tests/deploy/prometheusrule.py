"""deploy/components/prometheus-operator/prometheusrule.yaml from deploy/prometheus/ipamgc-rules.yaml, the
one source of ipamgc's alert rules (tests/deploy/test_alerts.py checks they are equal).  After changing the
rules:
    .venv/bin/python -m tests.deploy.prometheusrule
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "ipamgc-rules.yaml"
PROMETHEUS_RULE = ROOT / "deploy" / "components" / "prometheus-operator" / "prometheusrule.yaml"

HEADER = """\
# GENERATED from deploy/prometheus/ipamgc-rules.yaml (the one source of ipamgc's alerts; their comments
# are there): .venv/bin/python -m tests.deploy.prometheusrule.  tests/deploy/test_alerts.py checks that
# this spec equals that file.  Runbooks: docs/runbooks.md (each alert's runbook_url).
"""


class _Literal(str):
    pass


def _literal(dumper: yaml.SafeDumper, data: _Literal) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|")


def _blocks(node: Any) -> Any:
    """Multi-line strings (expressions) as literal blocks, so the file reads like the source."""
    if isinstance(node, dict):
        return {k: _blocks(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_blocks(v) for v in node]
    if isinstance(node, str) and "\n" in node:
        return _Literal(node)
    return node


def prometheus_rule(rules: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "ipamgc", "namespace": "ipamgc", "labels": {"app.kubernetes.io/name": "ipamgc"}},
        "spec": rules,
    }


def render() -> str:
    rules = yaml.safe_load(RULES.read_text())
    dumper = type("Dumper", (yaml.SafeDumper,), {})
    dumper.add_representer(_Literal, _literal)
    body = yaml.dump(_blocks(prometheus_rule(rules)), Dumper=dumper, sort_keys=False, width=110)
    return HEADER + body


if __name__ == "__main__":
    PROMETHEUS_RULE.write_text(render())
    print(f"wrote {PROMETHEUS_RULE.relative_to(ROOT)}")
