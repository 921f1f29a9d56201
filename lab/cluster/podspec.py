"""What a real-size simulated pod's spec is made of (`lab.cluster.podshape` puts it together): the
containers with their env, ports, probes, resources and mounts, the volumes, the affinity, and the
annotations a mesh injector and a secret agent add, per size profile.

Why a module: these are the long literal parts of a Deployment's pod; `podshape` keeps the sizes, the
template every pod of an app shares, the managedFields and the status, and stays readable.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

JsonObj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Profile:
    """What a size adds to the app's container (`lab.cluster.podshape.POD_SIZES` but small)."""

    sidecars: tuple[str, ...]  # containers beside the app's
    inits: tuple[str, ...]  # init containers
    env: int  # settings per container beside the common env
    config_volumes: int  # configMap volumes beside the app's config
    agent_annotations: bool  # the annotations a sidecar injector and a secret agent add
    # Large pods' extras: the full common env in every container, a secret and a memory emptyDir, a
    # startup probe, a preferred node affinity, a pod anti-affinity, a topology spread, and the
    # kubelet's per-container mounts and user in the status.
    wide: bool


PROFILES: dict[str, Profile] = {
    "real": Profile(
        sidecars=("envoy",), inits=(), env=0, config_volumes=0, agent_annotations=False, wide=False
    ),
    "large": Profile(
        sidecars=("envoy", "log-shipper", "metrics-exporter", "config-reloader"),
        inits=("migrate", "wait-for-deps"),
        env=8,
        config_volumes=4,
        agent_annotations=True,
        wide=True,
    ),
}


def digest(*parts: object) -> str:
    return hashlib.sha256("/".join(str(p) for p in parts).encode()).hexdigest()


def agent_annotations(seed: int, namespace: str, app: str, profile: Profile) -> dict[str, str]:
    """What a service-mesh injector and a secret agent write on a pod (large pods)."""
    status = {
        "initContainers": list(profile.inits),
        "containers": list(profile.sidecars),
        "volumes": ["workload-socket", "credential-socket", "workload-certs", "istio-envoy", "istio-data"],
        "imagePullSecrets": None,
        "revision": "1-24-2",
    }
    out = {
        "sidecar.istio.io/status": json.dumps(status, separators=(",", ":")),
        "istio.io/rev": "1-24-2",
        "kubectl.kubernetes.io/default-logs-container": app,
        "proxy.istio.io/config": '{"holdApplicationUntilProxyStarts":true,"terminationDrainDuration":"20s"}',
        "vault.hashicorp.com/agent-inject": "true",
        "vault.hashicorp.com/agent-inject-status": "injected",
        "vault.hashicorp.com/role": f"{namespace}-{app}",
        "cluster-autoscaler.kubernetes.io/safe-to-evict": "true",
        "checksum/secret": digest("secret", seed, namespace, app),
    }
    for what in ("db", "cache", "queue", "tls"):
        out[f"vault.hashicorp.com/agent-inject-secret-{what}"] = f"secret/data/{namespace}/{app}/{what}"
        out[f"vault.hashicorp.com/agent-inject-template-{what}"] = (
            f'{{{{- with secret "secret/data/{namespace}/{app}/{what}" -}}}}'
            "{{ range $k, $v := .Data.data }}{{ $k }}={{ $v }}\n{{ end }}{{- end }}"
        )
    return out


def volumes(app: str, token_volume: str, profile: Profile) -> list[JsonObj]:
    volumes: list[JsonObj] = [
        {
            "name": "config",
            "configMap": {"name": f"{app}-config", "defaultMode": 420},
        },
        {"name": "tmp", "emptyDir": {}},
    ]
    if profile.wide:
        volumes[1:1] = [{"name": "tls", "secret": {"secretName": f"{app}-tls", "defaultMode": 420}}]
        volumes.append({"name": "cache", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}})
    for i in range(profile.config_volumes):
        volumes.append(
            {"name": f"extra-config-{i}", "configMap": {"name": f"{app}-extra-{i}", "defaultMode": 420}}
        )
    volumes.append(
        {
            "name": token_volume,
            "projected": {
                "sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {
                        "configMap": {
                            "name": "kube-root-ca.crt",
                            "items": [{"key": "ca.crt", "path": "ca.crt"}],
                        }
                    },
                    {
                        "downwardAPI": {
                            "items": [
                                {
                                    "path": "namespace",
                                    "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                                }
                            ]
                        }
                    },
                ],
                "defaultMode": 420,
            },
        }
    )
    return volumes


def affinity(app: str, wide: bool) -> JsonObj:
    affinity: JsonObj = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]},
                            {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64", "arm64"]},
                        ]
                    }
                ]
            },
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 50,
                    "preference": {
                        "matchExpressions": [
                            {
                                "key": "node.kubernetes.io/instance-type",
                                "operator": "NotIn",
                                "values": ["spot"],
                            }
                        ]
                    },
                }
            ],
        },
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "podAffinityTerm": {
                        "labelSelector": {"matchLabels": {"app.kubernetes.io/name": app}},
                        "topologyKey": "kubernetes.io/hostname",
                    },
                }
            ]
        },
    }
    if not wide:
        del affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        del affinity["podAntiAffinity"]
    return affinity


def _env(app: str, container: str, profile: Profile, main: bool) -> list[JsonObj]:
    """A container's env: downward-API fields, secrets and configMaps by reference, plain settings."""
    wide = profile.wide
    field = [("POD_NAME", "metadata.name"), ("POD_NAMESPACE", "metadata.namespace")]
    if main or wide:
        field.append(("POD_IP", "status.podIP"))
    if wide:
        field.append(("NODE_NAME", "spec.nodeName"))
    env: list[JsonObj] = [
        {"name": n, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": p}}} for n, p in field
    ]
    env.append({"name": "LOG_LEVEL", "value": "info"})
    if wide:
        env += [
            {
                "name": "GOMEMLIMIT",
                "valueFrom": {
                    "resourceFieldRef": {
                        "containerName": container,
                        "resource": "limits.memory",
                        "divisor": "0",
                    }
                },
            }
        ]
    if main or wide:
        env += [
            {
                "name": "OTEL_EXPORTER_OTLP_ENDPOINT",
                "value": "http://otel-collector.observability.svc.cluster.local:4317",
            },
            {"name": "OTEL_SERVICE_NAME", "value": app},
        ]
    if main:
        env += [
            {"name": "DATABASE_URL", "valueFrom": {"secretKeyRef": {"name": f"{app}-db", "key": "url"}}},
            {
                "name": "FEATURE_FLAGS",
                "valueFrom": {"configMapKeyRef": {"name": f"{app}-flags", "key": "flags", "optional": True}},
            },
        ]
    if main and wide:
        env += [
            {
                "name": "OTEL_RESOURCE_ATTRIBUTES",
                "value": f"service.namespace=storefront,service.name={app},deployment.environment=production",
            },
            {
                "name": "DATABASE_PASSWORD",
                "valueFrom": {"secretKeyRef": {"name": f"{app}-db", "key": "password"}},
            },
            {"name": "REDIS_ADDR", "value": f"{app}-redis-master.storefront.svc.cluster.local:6379"},
            {
                "name": "JAVA_TOOL_OPTIONS",
                "value": "-XX:MaxRAMPercentage=75.0 -XX:+UseG1GC -XX:+ExitOnOutOfMemoryError "
                "-Dfile.encoding=UTF-8 -Djava.security.egd=file:/dev/./urandom",
            },
        ]
    for i in range(profile.env):
        env.append(
            {"name": f"{container.upper().replace('-', '_')}_SETTING_{i:02d}", "value": _setting(app, i)}
        )
    return env


def _setting(app: str, i: int) -> str:
    values = (
        "true",
        "30s",
        f"https://{app}.storefront.example.com/api/v2",
        "en-US,de-DE,fr-FR,ja-JP",
        "250",
        f"{app}-events.storefront.svc.cluster.local:9092",
        "info",
        "/etc/app/config.yaml",
    )
    return values[i % len(values)]


def container(
    app: str,
    name: str,
    index: int,
    version: str,
    token_volume: str,
    profile: Profile,
    *,
    main: bool,
    init: bool = False,
) -> JsonObj:
    cname = app if main else name
    image = f"registry.example.com/storefront/{cname}:v{version}" if main or init else _sidecar_image(name)
    mounts: list[JsonObj] = [
        {"name": "config", "mountPath": "/etc/app", "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
        {
            "name": token_volume,
            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
            "readOnly": True,
        },
    ]
    if not (main or profile.wide):
        del mounts[1]  # a sidecar writes no /tmp
    if main and profile.wide:
        mounts.insert(1, {"name": "tls", "mountPath": "/etc/tls", "readOnly": True})
        mounts.insert(3, {"name": "cache", "mountPath": "/var/cache/app"})
        mounts[3:3] = [
            {"name": f"extra-config-{i}", "mountPath": f"/etc/app/extra-{i}", "readOnly": True}
            for i in range(profile.config_volumes)
        ]
    port = 8080 + 100 * index
    c: JsonObj = {
        "name": cname,
        "image": image,
        "args": [
            f"--config=/etc/app/{cname}.yaml",
            f"--listen=:{port}",
            "--metrics-listen=:9090" if main else f"--admin-listen=:{port + 1}",
        ],
        "env": _env(app, cname, profile, main),
        "resources": {
            "limits": {"cpu": "1" if main else "500m", "memory": "1Gi" if main else "256Mi"},
            "requests": {"cpu": "250m" if main else "50m", "memory": "512Mi" if main else "64Mi"},
        },
        "volumeMounts": mounts,
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent",
        "securityContext": {
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
        },
    }
    if init:
        return c
    ports = [{"name": "http" if main else f"{name[:10]}-http", "containerPort": port, "protocol": "TCP"}]
    if main:
        ports.append({"name": "metrics", "containerPort": 9090, "protocol": "TCP"})
    c["ports"] = ports
    probe_port = "http" if main else port
    if main or profile.wide:
        c["livenessProbe"] = _probe("/healthz", probe_port, 10, 3)
    c["readinessProbe"] = _probe("/readyz", probe_port, 5, 3)
    if main and profile.wide:
        c["startupProbe"] = _probe("/healthz", probe_port, 5, 30)
    return c


def _sidecar_image(name: str) -> str:
    return {
        "envoy": "docker.io/envoyproxy/envoy:v1.32.3",
        "log-shipper": "cr.fluentbit.io/fluent/fluent-bit:3.2.4",
        "metrics-exporter": "quay.io/prometheus/statsd-exporter:v0.28.0",
        "config-reloader": "ghcr.io/jimmidyson/configmap-reload:v0.14.0",
    }.get(name, f"registry.example.com/platform/{name}:v1.0.0")


def _probe(path: str, port: int | str, period: int, failures: int) -> JsonObj:
    return {
        "httpGet": {"path": path, "port": port, "scheme": "HTTP"},
        "initialDelaySeconds": 5,
        "timeoutSeconds": 2,
        "periodSeconds": period,
        "successThreshold": 1,
        "failureThreshold": failures,
    }


def status_mounts(container: Mapping[str, Any]) -> list[JsonObj]:
    out = []
    for m in container["volumeMounts"]:
        item: JsonObj = {"name": m["name"], "mountPath": m["mountPath"]}
        if m.get("readOnly"):
            item["readOnly"] = True
            item["recursiveReadOnly"] = "Disabled"
        out.append(item)
    return out
