"""deploy/components/, the optional kustomize components, rendered here as kustomize would (no kustomize
binary on this machine: the component's JSON 6902 `add` patches and resources are applied by the small
renderer below) and checked: the patched HPA is valid against the Kubernetes schema and reads the External
metric that the shipped prometheus-adapter rule serves, under the name the watcher exposes; the PodMonitor
selects every component's pods on a port they declare."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

from shared import metrics_names as m
from tests.deploy.conftest import DEPLOY, Obj, find, load_manifests
from tests.deploy.kube_versions import KUBERNETES_VERSIONS

COMPONENTS = DEPLOY / "components"


def _component(name: str) -> dict[str, Any]:
    doc = yaml.safe_load((COMPONENTS / name / "kustomization.yaml").read_text())
    assert doc["apiVersion"] == "kustomize.config.k8s.io/v1alpha1" and doc["kind"] == "Component"
    assert isinstance(doc, dict)
    return doc


def _add(obj: Obj, path: str, value: Any) -> None:
    *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in path.strip("/").split("/")]
    node: Any = obj
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node[p]
    if isinstance(node, list):
        node.insert(len(node) if last == "-" else int(last), value)
    else:
        node[last] = value


def render(name: str) -> list[Obj]:
    """The base with one component applied (its resources added, its JSON 6902 patches applied)."""
    objs = copy.deepcopy(load_manifests())
    comp = _component(name)
    assert set(comp) <= {"apiVersion", "kind", "patches", "resources"}
    for res in comp.get("resources", []):
        objs += [d for d in yaml.safe_load_all((COMPONENTS / name / res).read_text()) if d]
    for patch in comp.get("patches", []):
        t = patch["target"]
        [target] = [
            o for o in find(objs, t["kind"], t["name"]) if o["apiVersion"] == f"{t['group']}/{t['version']}"
        ]
        for op in yaml.safe_load(patch["patch"]):
            assert op["op"] == "add", op  # the renderer implements what the components use
            _add(target, op["path"], op["value"])
    return objs


def test_backlog_autoscaling_reads_the_metric_the_adapter_rule_serves() -> None:
    objs = render("backlog-autoscaling")
    [hpa] = find(objs, "HorizontalPodAutoscaler")
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(hpa, version, strict=True)
    external = [x["external"]["metric"]["name"] for x in hpa["spec"]["metrics"] if x["type"] == "External"]
    assert external == [m.SHARD_DIRTY]
    assert any(x["type"] == "Resource" for x in hpa["spec"]["metrics"])  # CPU stays
    rules = yaml.safe_load((COMPONENTS / "backlog-autoscaling" / "prometheus-adapter-rules.yaml").read_text())
    [rule] = rules["rules"]["external"]
    assert rule["name"]["as"] == m.SHARD_DIRTY
    assert rule["seriesQuery"].startswith(m.SHARD_DIRTY + "{") and rule["metricsQuery"].startswith("sum(")
    [ns] = find(objs, "Namespace")
    assert f'namespace="{ns["metadata"]["name"]}"' in rule["metricsQuery"]
    # The base is untouched by rendering the component.
    [base_hpa] = find(load_manifests(), "HorizontalPodAutoscaler")
    assert [x["type"] for x in base_hpa["spec"]["metrics"]] == ["Resource"]


def test_the_pod_monitor_selects_every_component_on_its_metrics_port() -> None:
    objs = render("prometheus-operator")
    [pm] = find(objs, "PodMonitor")
    assert pm["apiVersion"] == "monitoring.coreos.com/v1"
    assert pm["metadata"]["namespace"] == "ipamgc"
    selector = pm["spec"]["selector"]
    [endpoint] = pm["spec"]["podMetricsEndpoints"]
    selected = []
    for d in find(objs, "Deployment") + find(objs, "StatefulSet"):
        labels = d["spec"]["template"]["metadata"]["labels"]
        matches = selector["matchLabels"].items() <= labels.items() and all(
            labels.get(e["key"]) in e["values"]
            for e in selector.get("matchExpressions", [])
            if e["operator"] == "In"
        )
        if matches:
            selected.append(labels["app.kubernetes.io/component"])
            [c] = d["spec"]["template"]["spec"]["containers"]
            ports = {p["name"]: p["containerPort"] for p in c["ports"]}
            assert ports[endpoint["port"]] == m.DEFAULT_METRICS_PORT
    assert sorted(selected) == ["leader", "watcher", "worker"]  # not Redis


def test_components_are_not_in_the_base() -> None:
    k = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert "components" not in k
    assert sorted(p.name for p in COMPONENTS.iterdir() if p.is_dir()) == [
        "backlog-autoscaling",
        "prometheus-operator",
    ]
    assert all(
        (COMPONENTS / n / "kustomization.yaml").is_file()
        for n in ("backlog-autoscaling", "prometheus-operator")
    )
    assert Path(DEPLOY / "components").is_dir()
