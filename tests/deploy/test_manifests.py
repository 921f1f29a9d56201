"""deploy/ offline: every object valid against the Kubernetes JSON schemas (the `kubernetes-validate`
package, strict: unknown fields are errors), and the properties the deployment promises — non-root,
read-only root filesystem, resource requests, httpGet probes on the metrics port, replicas, PDBs, the
worker HPA, the Redis Secret and NetworkPolicy — checked on the objects themselves."""

from __future__ import annotations

import re
from pathlib import Path

import kubernetes_validate
import pytest

from shared import metrics_names as m
from shared.shard import DEFAULT_SHARDS
from tests.deploy.conftest import DEPLOY, ROOT, Obj, find, kustomization, load_manifests
from tests.deploy.kube_versions import KUBERNETES_VERSIONS

COMPONENTS = {
    "ipamgc-watcher": ("watcher", "watch"),
    "ipamgc-worker": ("worker", "work"),
    "ipamgc-leader": ("leader", "lead"),
}
KUSTOMIZATION_FIELDS = {
    "apiVersion",
    "kind",
    "namespace",
    "resources",
    "images",
    "configMapGenerator",
    "labels",
}


def workloads(objs: list[Obj]) -> list[Obj]:
    return find(objs, "Deployment") + find(objs, "StatefulSet")


def docker_uid() -> int:
    match = re.search(r"^USER (\d+)(?::\d+)?$", (ROOT / "Dockerfile").read_text(), re.MULTILINE)
    assert match, "the Dockerfile runs as a numeric non-root user"
    return int(match.group(1))


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("obj", load_manifests(), ids=lambda o: f"{o['kind']}/{o['metadata']['name']}")
def test_every_object_is_valid_against_the_kubernetes_schema(obj: Obj, version: str) -> None:
    kubernetes_validate.validate(obj, version, strict=True)


def test_the_kustomization_is_complete(manifests: list[Obj]) -> None:
    k = kustomization()
    assert set(k) <= KUSTOMIZATION_FIELDS, set(k) - KUSTOMIZATION_FIELDS
    assert k["apiVersion"] == "kustomize.config.k8s.io/v1beta1" and k["kind"] == "Kustomization"
    listed = set(k["resources"])
    on_disk = {p.name for p in DEPLOY.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk, "every manifest is in the kustomization, and only those"
    for gen in k["configMapGenerator"]:
        assert all((DEPLOY / f).is_file() for f in gen["files"])
    [image] = k["images"]
    for w in workloads(manifests):
        pod = w["spec"]["template"]["spec"]
        for c in pod["containers"] + pod.get("initContainers", []):
            if c["name"] != "redis":
                assert c["image"].split(":")[0] == image["name"]
    namespaced = [o for o in manifests if o["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding")]
    assert {o["metadata"].get("namespace") for o in namespaced} == {k["namespace"]}


def test_pods_are_non_root_read_only_with_requests_and_probes(manifests: list[Obj]) -> None:
    uid = docker_uid()
    for w in workloads(manifests):
        name = w["metadata"]["name"]
        pod = w["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, name
            assert sc["allowPrivilegeEscalation"] is False, name
            assert sc["capabilities"] == {"drop": ["ALL"]}, name
            assert {"cpu", "memory"} <= set(c["resources"]["requests"]), name
            assert "memory" in c["resources"]["limits"], name
            assert "livenessProbe" in c and "readinessProbe" in c, name
        if name not in COMPONENTS:
            continue
        component, verb = COMPONENTS[name]
        [c] = pod["containers"]
        assert pod["securityContext"]["runAsUser"] == uid
        assert c["args"][0] == verb
        # httpGet on the metrics port, answered from memory (ipamgc/healthz.py): no exec, no Redis
        for probe, path in ((c["livenessProbe"], "/livez"), (c["readinessProbe"], "/readyz")):
            assert "exec" not in probe, (name, component)
            assert probe["httpGet"] == {"path": path, "port": "metrics"}, name
        assert [p["name"] for p in c["ports"]] == ["metrics"]
        env = {e["name"]: e for e in c["env"]}
        assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"  # heartbeat instance
        ref = env["REDIS_URL"]["valueFrom"]["secretKeyRef"]
        [secret] = find(manifests, "Secret", ref["name"])
        assert ref["key"] in secret["stringData"]
        assert [p["containerPort"] for p in c["ports"]] == [m.DEFAULT_METRICS_PORT]
        ann = w["spec"]["template"]["metadata"]["annotations"]
        assert ann["prometheus.io/port"] == str(m.DEFAULT_METRICS_PORT)
        mounts = {v["mountPath"] for v in c["volumeMounts"]}
        assert "/tmp" in mounts


def test_replicas_disruption_budgets_and_the_worker_autoscaler(manifests: list[Obj]) -> None:
    deployments = {d["metadata"]["name"]: d for d in find(manifests, "Deployment")}
    assert deployments["ipamgc-watcher"]["spec"]["replicas"] == 2  # one active through the Lease
    assert deployments["ipamgc-leader"]["spec"]["replicas"] == 2
    workloads = {s["metadata"]["name"]: s for s in find(manifests, "StatefulSet")}
    budgets = find(manifests, "PodDisruptionBudget")
    covered = set()
    for pdb in budgets:
        selector = pdb["spec"]["selector"]["matchLabels"]
        for name, d in {**deployments, **workloads}.items():
            if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items():
                covered.add(name)
        assert pdb["spec"]["maxUnavailable"] == 1  # a drain never blocks, even at one replica
    assert covered == {*COMPONENTS, "ipamgc-redis"}
    [hpa] = find(manifests, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "ipamgc-worker"
    assert hpa["spec"]["maxReplicas"] <= DEFAULT_SHARDS  # one job per shard at a time
    # The base scales on CPU only (metrics-server); the backlog metric is components/backlog-autoscaling's.
    assert [x["type"] for x in hpa["spec"]["metrics"]] == ["Resource"]


def test_only_ipamgc_pods_reach_redis(manifests: list[Obj]) -> None:
    [policy] = find(manifests, "NetworkPolicy", "ipamgc-redis")
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"] and "egress" not in policy["spec"]
    [redis] = find(manifests, "StatefulSet", "ipamgc-redis")
    [service] = find(manifests, "Service", "ipamgc-redis")
    pod_labels = redis["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert service["spec"]["selector"].items() <= pod_labels.items()
    [rule] = policy["spec"]["ingress"]
    allowed = rule["from"][0]["podSelector"]["matchLabels"]
    for w in workloads(manifests):
        assert allowed.items() <= w["spec"]["template"]["metadata"]["labels"].items()
    [secret] = find(manifests, "Secret", "ipamgc-redis")
    # One URL per Redis user (shared/acl.py), each naming its user and the Service.
    for user in ("watcher", "worker", "leader", "reader"):
        url = secret["stringData"][f"{user}-url"]
        assert re.fullmatch(rf"redis://{user}:[^@\s]+@{service['metadata']['name']}:6379/0", url), url


def test_each_component_reaches_only_redis_dns_and_the_api_server(manifests: list[Obj]) -> None:
    """Egress: Redis's pods on 6379, the cluster DNS on 53, and (not the workers, which hold no token) the
    API server's ports; ingress: the metrics port only."""
    for name, (component, _verb) in COMPONENTS.items():
        [policy] = find(manifests, "NetworkPolicy", name)
        [d] = find(manifests, "Deployment", name)
        assert (
            policy["spec"]["podSelector"]["matchLabels"].items()
            <= d["spec"]["template"]["metadata"]["labels"].items()
        )
        assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
        assert policy["spec"]["ingress"] == [{"ports": [{"protocol": "TCP", "port": m.DEFAULT_METRICS_PORT}]}]
        ports = [sorted({p["port"] for p in rule["ports"]}) for rule in policy["spec"]["egress"]]
        assert ports == [[6379], [53]] + ([[443, 6443]] if component != "worker" else []), name
        assert policy["spec"]["egress"][0]["to"][0]["podSelector"]["matchLabels"] == {
            "app.kubernetes.io/name": "ipamgc",
            "app.kubernetes.io/component": "redis",
        }


def test_the_namespace_enforces_the_restricted_pod_security_standard(manifests: list[Obj]) -> None:
    [ns] = find(manifests, "Namespace")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert Path(DEPLOY / "grafana" / "ipamgc-dashboard.json").is_file()
