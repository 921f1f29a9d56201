"""deploy/helm/ipamgc rendered by the real helm (built by .ci/deploy-checks, tests/deploy/tools.py): with
deploy/'s defaults it renders deploy/'s kustomize objects (names, specs, RBAC rules; only Helm's labels, the
Secret layout — one Secret per component — and explicit Lease names differ); every value does what
values.yaml says; placeholder and missing passwords refuse to render.  helm lint and
`helm template | kubernetes-validate --strict` run in .ci/deploy-checks."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.conftest import DEPLOY, Obj, find, kustomization, load_manifests
from tests.deploy.prometheusrule import RULES
from tests.deploy.tools import tool

CHART = DEPLOY / "helm" / "ipamgc"
HERE = Path(__file__).parent / "helm"
CI_VALUES = HERE / "ci-values.yaml"
ALL_VALUES = HERE / "all-values.yaml"
HELM_LABELS = (
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
)
COMPONENTS = ("watcher", "worker", "leader", "reader")


def helm_template(*values: Path, sets: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    args = [tool("helm"), "template", "ipamgc", str(CHART), "--namespace", "ipamgc"]
    for v in values:
        args += ["-f", str(v)]
    for s in sets:
        args += ["--set", s]
    return subprocess.run(args, check=False, capture_output=True, text=True, timeout=120)


def render(*values: Path, sets: tuple[str, ...] = ()) -> list[Obj]:
    done = helm_template(*values, sets=sets)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def _strip_helm(obj: Obj) -> Obj:
    """An object as kustomize would have it: Helm's labels and the chart's checksums dropped."""
    o = copy.deepcopy(obj)
    for meta in [o["metadata"], o.get("spec", {}).get("template", {}).get("metadata", {})]:
        for label in HELM_LABELS:
            meta.get("labels", {}).pop(label, None)
        ann = meta.get("annotations", {})
        for key in [k for k in ann if k.startswith("checksum/")]:
            del ann[key]
        if "annotations" in meta and not ann:
            del meta["annotations"]
    return o


def _kustomize_view(obj: Obj) -> Obj:
    """A chart's Deployment or StatefulSet with the chart's deliberate differences undone: one Secret per
    component (`<fullname>-redis-<c>`, key `url`) instead of one Secret with four keys, explicit Lease
    names, the metrics port in the environment, the image pull policy."""
    o = _strip_helm(obj)
    if o["metadata"]["name"] == "ipamgc-worker":  # the HPA owns the count: the chart leaves it out
        assert "replicas" not in o["spec"]
        o["spec"]["replicas"] = yaml.safe_load((CHART / "values.yaml").read_text())["worker"]["replicas"]
    pod = o["spec"]["template"]["spec"]
    for c in pod["containers"] + pod.get("initContainers", []):
        c.pop("imagePullPolicy", None)
        env = [e for e in c.get("env", []) if e["name"] != "IPAMGC_METRICS_PORT"]
        for e in env:
            ref = e.get("valueFrom", {}).get("secretKeyRef")
            if ref and ref["name"].startswith("ipamgc-redis-"):
                component = ref["name"].removeprefix("ipamgc-redis-")
                e["valueFrom"]["secretKeyRef"] = {"name": "ipamgc-redis", "key": f"{component}-url"}
        if "env" in c:
            c["env"] = env
        args = c.get("args", [])
        if "--lease-name" in args:
            i = args.index("--lease-name")
            assert args[i + 1] == f"ipamgc-{c['name']}"  # the default Lease name of the component
            del args[i : i + 2]
        if "image" in c and c["image"].startswith("ipamgc:"):
            c["image"] = f"ipamgc:{kustomization()['images'][0]['newTag']}"
    return o


def test_with_deploys_defaults_it_renders_deploys_objects() -> None:
    chart = render(CI_VALUES)
    kustomize = [o for o in load_manifests() if o["kind"] != "Namespace"]  # createNamespace: false
    gen = kustomization()["configMapGenerator"]
    assert [g["name"] for g in gen] == ["ipamgc-grafana-dashboard"]
    key = lambda o: (o["kind"], o["metadata"]["name"])  # noqa: E731
    chart_by = {key(o): o for o in chart}
    expected = {key(o) for o in kustomize if o["kind"] != "Secret"}
    expected |= {("ConfigMap", "ipamgc-grafana-dashboard")} | {
        ("Secret", f"ipamgc-redis-{c}") for c in COMPONENTS
    }
    assert set(chart_by) == expected
    for o in kustomize:
        if o["kind"] == "Secret":
            continue
        got = chart_by[key(o)]
        if o["kind"] in ("Deployment", "StatefulSet"):
            assert _kustomize_view(got) == o, key(o)
        else:
            assert _strip_helm(got) == o, key(o)
    # kustomize's configMapGenerator: the dashboard file, labelled for Grafana's sidecar
    [dashboard] = find(chart, "ConfigMap", "ipamgc-grafana-dashboard")
    [g] = gen
    [path] = g["files"]
    assert dashboard["data"] == {Path(path).name: (DEPLOY / path).read_text()}
    assert g["options"]["labels"].items() <= dashboard["metadata"]["labels"].items()


def test_one_secret_per_component_holds_its_url() -> None:
    chart = render(CI_VALUES)
    passwords = yaml.safe_load(CI_VALUES.read_text())["redis"]["passwords"]
    [kustomize_secret] = find(load_manifests(), "Secret", "ipamgc-redis")
    for c in COMPONENTS:
        [secret] = find(chart, "Secret", f"ipamgc-redis-{c}")
        shipped = kustomize_secret["stringData"][f"{c}-url"]
        assert secret["stringData"] == {"url": shipped.replace(f"change-me-{c}", passwords[c])}
    for d in find(chart, "Deployment"):
        component = d["metadata"]["name"].removeprefix("ipamgc-")
        [c] = d["spec"]["template"]["spec"]["containers"]
        refs = [e["valueFrom"]["secretKeyRef"] for e in c["env"] if "secretKeyRef" in e.get("valueFrom", {})]
        assert refs == [{"name": f"ipamgc-redis-{component}", "key": "url"}]  # its own URL only


@pytest.mark.parametrize("component", COMPONENTS)
def test_a_placeholder_password_refuses_to_render(component: str) -> None:
    done = helm_template(CI_VALUES, sets=(f"redis.passwords.{component}=Change-Me-{component}",))
    assert done.returncode != 0 and done.stdout == ""
    assert f"redis.passwords.{component} is deploy/'s placeholder" in done.stderr


def test_missing_and_unquotable_passwords_refuse_to_render() -> None:
    empty = helm_template()
    assert empty.returncode != 0 and "redis.passwords.watcher is empty" in empty.stderr
    odd = helm_template(CI_VALUES, sets=("redis.passwords.leader=p@ss/word",))
    assert odd.returncode != 0 and "redis.passwords.leader: use letters, digits" in odd.stderr


def test_an_external_url_with_a_placeholder_refuses_to_render() -> None:
    url = "redis.external.urls.worker=redis://worker:change-me-worker@redis.example:6379/0"
    done = helm_template(CI_VALUES, ALL_VALUES, sets=(url,))
    assert done.returncode != 0
    assert "redis.external.urls.worker holds deploy/'s placeholder password" in done.stderr
    missing = helm_template(CI_VALUES, ALL_VALUES, sets=("redis.external.urls.leader=",))
    assert missing.returncode != 0 and "set redis.external.urls.leader" in missing.stderr


def _container(objs: list[Obj], name: str) -> Obj:
    [d] = find(objs, "Deployment", name)
    [c] = d["spec"]["template"]["spec"]["containers"]
    assert isinstance(c, dict)
    return c


def test_every_optional_piece() -> None:
    objs = render(CI_VALUES, ALL_VALUES)
    values = yaml.safe_load(ALL_VALUES.read_text())
    # the Namespace, restricted
    [ns] = find(objs, "Namespace")
    assert ns["metadata"]["name"] == "ipamgc"
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    # the grace override and the API group on the watcher and the leader, not on the workers
    for name, has in (("ipamgc-watcher", True), ("ipamgc-leader", True), ("ipamgc-worker", False)):
        env = {e["name"]: e.get("value") for e in _container(objs, name)["env"]}
        assert (env.get("IPAMGC_LEAK_GRACE_PERIOD") == "90s") is has, name
        assert (env.get("IPAMGC_CALICO_API_GROUP") == "projectcalico.org/v3") is has, name
    # the dry run, on the leader only
    assert "--dry-run" in _container(objs, "ipamgc-leader")["args"]
    assert "--dry-run" not in _container(objs, "ipamgc-watcher")["args"]
    # the image by digest, and the pull secret
    image = _container(objs, "ipamgc-worker")["image"]
    assert image == f"registry.example.com/ipamgc@{values['image']['digest']}"
    [worker] = find(objs, "Deployment", "ipamgc-worker")
    assert worker["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "registry"}]
    assert "replicas" not in worker["spec"]  # the HPA owns it
    # backlog autoscaling: the External metric first, CPU kept
    [hpa] = find(objs, "HorizontalPodAutoscaler")
    assert [x["type"] for x in hpa["spec"]["metrics"]] == ["External", "Resource"]
    assert hpa["spec"]["metrics"][0]["external"]["metric"]["name"] == "ipamgc_shard_dirty"
    # external Redis: no StatefulSet, Service or Redis NetworkPolicy; one Secret per URL given; the reader's
    assert not find(objs, "StatefulSet") and not find(objs, "Service")
    assert not find(objs, "NetworkPolicy", "ipamgc-redis") and len(find(objs, "NetworkPolicy")) == 3
    urls = values["redis"]["external"]["urls"]
    for c in ("watcher", "worker", "leader"):
        [secret] = find(objs, "Secret", f"ipamgc-redis-{c}")
        assert secret["stringData"]["url"] == urls[c]
        [ref] = [e for e in _container(objs, f"ipamgc-{c}")["env"] if e["name"] == "REDIS_URL"]
        assert ref["valueFrom"]["secretKeyRef"] == {"name": f"ipamgc-redis-{c}", "key": "url"}
    assert not find(objs, "Secret", "ipamgc-redis-reader")
    # the PodMonitor and the PrometheusRule, labelled for the operator's Prometheus
    [pm] = find(objs, "PodMonitor")
    [rule] = find(objs, "PrometheusRule")
    for o in (pm, rule):
        assert o["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    source = yaml.safe_load(RULES.read_text())
    base = values["metrics"]["prometheusRule"]["runbookBaseURL"]
    for g in source["groups"]:
        for r in g["rules"]:
            r["annotations"]["runbook_url"] = base + r["annotations"]["runbook_url"]
    assert rule["spec"] == source


def test_the_prometheus_rule_without_a_base_url_is_the_rules_file() -> None:
    """With the PodMonitor, every group; without it, the absent() group left out: whether anything
    scrapes the pods is unknown to the chart, and absent() would fire on day one."""
    source = yaml.safe_load(RULES.read_text())
    on = ("metrics.prometheusRule.enabled=true", "metrics.podMonitor.enabled=true")
    [rule] = find(render(CI_VALUES, sets=on), "PrometheusRule")
    assert rule["spec"] == source
    [rule] = find(render(CI_VALUES, sets=on[:1]), "PrometheusRule")
    assert [g["name"] for g in rule["spec"]["groups"]] == ["ipamgc"]
    assert rule["spec"]["groups"] == [g for g in source["groups"] if g["name"] != "ipamgc-scrape"]
    assert "absent(" not in yaml.safe_dump(rule["spec"])


def test_replicas_resources_and_fullname() -> None:
    objs = render(
        CI_VALUES,
        sets=(
            "fullnameOverride=gc",
            "watcher.replicas=3",
            "leader.resources.limits.memory=1Gi",
            "worker.autoscaling.enabled=false",
            "worker.replicas=4",
            "grafanaDashboard.enabled=false",
            "checkClusterRole=false",
        ),
    )
    [watcher] = find(objs, "Deployment", "gc-watcher")
    assert watcher["spec"]["replicas"] == 3
    assert _container(objs, "gc-leader")["resources"]["limits"]["memory"] == "1Gi"
    assert "--lease-name" in _container(objs, "gc-leader")["args"]
    args = _container(objs, "gc-leader")["args"]
    assert args[args.index("--lease-name") + 1] == "gc-leader"
    [role] = find(objs, "Role", "gc-leader-lease")
    assert ["gc-leader"] in [r.get("resourceNames") for r in role["rules"]]  # the Lease it may update
    [worker] = find(objs, "Deployment", "gc-worker")
    assert worker["spec"]["replicas"] == 4 and not find(objs, "HorizontalPodAutoscaler")
    assert not find(objs, "ConfigMap") and not find(objs, "ClusterRole", "gc-check")
    [secret] = find(objs, "Secret", "gc-redis-worker")
    assert "@gc-redis:6379/0" in secret["stringData"]["url"]


def test_an_external_sentinel_gets_its_ports_through_the_network_policy() -> None:
    sentinel = "redis+sentinel://watcher:5e4d3c2b1a09f8e7d6c5b4a39281706f@s-0:26379,s-1:26379/mymaster/0"
    objs = render(
        CI_VALUES,
        ALL_VALUES,
        sets=(
            "redis.external.urls.watcher=" + sentinel.replace(",", "\\,"),  # --set splits on commas
            "networkPolicy.externalRedis.port=6380",
            "networkPolicy.externalRedis.sentinelPorts={26379}",
        ),
    )
    [secret] = find(objs, "Secret", "ipamgc-redis-watcher")
    assert secret["stringData"]["url"] == sentinel
    [policy] = find(objs, "NetworkPolicy", "ipamgc-watcher")
    [redis_rule] = [r for r in policy["spec"]["egress"] if {"protocol": "TCP", "port": 6380} in r["ports"]]
    assert redis_rule["ports"] == [{"protocol": "TCP", "port": 6380}, {"protocol": "TCP", "port": 26379}]
