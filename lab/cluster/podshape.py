"""Pods the size of a real Deployment's (issue 42): the simulated cluster's pods in three sizes.

Why: every figure ipamgc published was taken with simulated pods of a few hundred bytes of JSON (one
`pause` container, no managedFields), where real pods are 10–20 KB (docs/pod-sizes.md gives the sources
and the sizes measured here).  What a pod costs a collector is mostly decoding what it does not read, so
the simulated pods must carry it:

- ``small``: today's pods, byte for byte (`lab.cluster.objects.pod_object` untouched);
- ``real`` (~10–15 KB of JSON): a Deployment's pod as a cluster serves it: two containers and an init
  container with env, ports, probes, resources and volume mounts; a projected service-account token, a
  configMap, a secret and emptyDirs; tolerations, node affinity, a topology spread; an ownerReference to
  its ReplicaSet; the labels and annotations controllers and tools set (pod-template-hash,
  app.kubernetes.io/*, kubectl.kubernetes.io/restartedAt, prometheus.io/*, Calico's
  cni.projectcalico.org/containerID); a status with conditions and container statuses; and the
  managedFields of the four managers that write a real pod: kube-controller-manager (its create),
  kube-scheduler (PodScheduled), calico (its CNI's annotations) and the kubelet (the status);
- ``large`` (~50 KB): the same with five containers, two init containers, more env and volumes, and the
  annotations sidecar injectors and secret agents add, managedFields growing with them.

What the collectors read is never dressed: name, namespace, uid, spec.nodeName, spec.hostNetwork,
status.phase/reason/podIP/podIPs, Calico's IP annotations (cni.projectcalico.org/podIP(s): only when the
caller gives them, as for a small pod) and deletionTimestamp keep the values a small pod has, and a
KubeVirt launcher pod gets no ownerReferences (as its small pod).  tests/lab/cluster/test_pod_sizes.py
holds the slim record of a dressed pod equal to the small one's.

Deterministic: every choice is a function of (seed, namespace, name) through sha256, with no random
draw, so the `real` cluster of a seed is the `small` cluster of that seed (the same IPs, handles and
events), only bigger.

Memory: a Deployment's pods share their template, and so do these: a pod's spec (but nodeName), its
labels and ownerReferences and kube-controller-manager's managedFields entry are built once per (seed,
size, namespace, app) and shared by every pod of that app.  That is safe because the simulated store
never changes a stored object in place (every write builds a new dict; reads hand out copies).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lab.cluster import podspec
from lab.cluster.managedfields import condition_fields, entry, fields_of, fields_v1, kubelet_fields
from lab.cluster.podspec import PROFILES, digest
from lab.cluster.podstatus import READY, SCHEDULED, PodSize, dressed_status, status_body

__all__ = [
    "CREATOR",
    "KUBELET",
    "LAUNCHER_CREATOR",
    "POD_SIZES",
    "POD_SIZE_HELP",
    "PodSize",
    "dress",
    "dressed_status",
    "pod_size",
]

#: The sizes, smallest first (the choices of `--pod-size`).
POD_SIZES: tuple[PodSize, ...] = ("small", "real", "large")
#: `--pod-size`'s help, the same on every command that takes it.
POD_SIZE_HELP = (
    "Size of the simulated cluster's pods: small (the simulator's minimal pods, ~0.4 KB of JSON), real (a "
    "Deployment's pod with managedFields, ~14 KB) or large (~54 KB); docs/pod-sizes.md."
)

JsonObj = dict[str, Any]

#: The field managers of the actors' pod writes: who creates a Deployment's pod, a KubeVirt launcher
#: pod, and who reports a pod's status (a real API server records its managedFields by these).
CREATOR = "kube-controller-manager"
LAUNCHER_CREATOR = "virt-controller"
KUBELET = "kubelet"

#: When the simulated Deployment's pods were made (the same constant as the small pods' creation time).
CREATED = "2025-01-21T17:51:44Z"
ANNOTATED = "2025-01-21T17:51:45Z"
RESTARTED = "2025-01-14T09:12:03Z"

#: The workloads a simulated pod belongs to (its app is chosen from its name).
APPS = (
    "checkout",
    "cart",
    "catalog",
    "payments",
    "search",
    "frontend",
    "recommendations",
    "shipping",
)
_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # what Kubernetes' names are made of (pod-template-hash)


def pod_size(value: str) -> PodSize:
    """`value` as a pod size; ValueError naming the sizes otherwise."""
    if value not in POD_SIZES:
        raise ValueError(f"unknown pod size {value!r}: expected one of {', '.join(POD_SIZES)}")
    return value


def _uid(*parts: object) -> str:
    h = digest(*parts)
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _name_suffix(length: int, *parts: object) -> str:
    n = int(digest(*parts), 16)
    out = []
    for _ in range(length):
        n, i = divmod(n, len(_ALPHABET))
        out.append(_ALPHABET[i])
    return "".join(out)


def _app_of(seed: int, namespace: str, name: str) -> str:
    return APPS[int(digest("app", seed, namespace, name)[:8], 16) % len(APPS)]


# -- the template: what every pod of one app shares ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Template:
    labels: Mapping[str, str]
    annotations: Mapping[str, str]  # the tools' (Calico's come per pod)
    owner_references: list[JsonObj] | None
    spec: Mapping[str, Any]  # without nodeName
    creator: JsonObj  # the creating controller's managedFields entry
    scheduler: JsonObj
    status_fields: Mapping[str, JsonObj]  # phase → the kubelet's fields but IPs


@functools.lru_cache(maxsize=4096)
def _template(seed: int, size: str, namespace: str, app: str, launcher: bool) -> _Template:
    profile = PROFILES[size]
    version = f"{1 + int(digest('v', seed, app)[:2], 16) % 4}.{int(digest('m', seed, app)[:2], 16) % 30}.0"
    template_hash = _name_suffix(10, "template", seed, namespace, app)
    if launcher:
        labels = {"kubevirt.io": "virt-launcher", "app.kubernetes.io/managed-by": "virt-controller"}
        owners = None
        creator = LAUNCHER_CREATOR
    else:
        labels = {
            "app": app,
            "app.kubernetes.io/component": "server",
            "app.kubernetes.io/instance": f"{app}-{namespace}",
            "app.kubernetes.io/managed-by": "Helm",
            "app.kubernetes.io/name": app,
            "app.kubernetes.io/part-of": "storefront",
            "app.kubernetes.io/version": version,
            "helm.sh/chart": f"{app}-{version}",
            "pod-template-hash": template_hash,
        }
        owners = [
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "name": f"{app}-{template_hash}",
                "uid": _uid("replicaset", seed, namespace, app),
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        creator = CREATOR
    annotations = {
        "kubectl.kubernetes.io/default-container": app,
        "kubectl.kubernetes.io/restartedAt": RESTARTED,
        "prometheus.io/path": "/metrics",
        "prometheus.io/port": "9090",
        "prometheus.io/scrape": "true",
        "checksum/config": digest("config", seed, namespace, app),
    }
    if profile.agent_annotations:
        annotations.update(podspec.agent_annotations(seed, namespace, app, profile))
    token_volume = f"kube-api-access-{_name_suffix(5, 'token', seed, namespace, app)}"
    volumes = podspec.volumes(app, token_volume, profile)
    names = [app, *profile.sidecars]
    containers = [
        podspec.container(app, c, i, version, token_volume, profile, main=(i == 0))
        for i, c in enumerate(names)
    ]
    inits = [
        podspec.container(app, c, 10 + i, version, token_volume, profile, main=False, init=True)
        for i, c in enumerate(profile.inits)
    ]
    spec: JsonObj = {
        "volumes": volumes,
        **({"initContainers": inits} if inits else {}),
        "containers": containers,
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default",
        "serviceAccount": "default",
        "securityContext": {
            "runAsUser": 10001,
            "runAsGroup": 10001,
            "runAsNonRoot": True,
            "fsGroup": 10001,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "affinity": podspec.affinity(app, profile.wide),
        "schedulerName": "default-scheduler",
        "tolerations": [
            {"key": "dedicated", "operator": "Equal", "value": "apps", "effect": "NoSchedule"},
            {
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            },
            {
                "key": "node.kubernetes.io/unreachable",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            },
        ],
        "priority": 0,
        "enableServiceLinks": False,
        "preemptionPolicy": "PreemptLowerPriority",
    }
    if profile.wide:
        spec["topologySpreadConstraints"] = [
            {
                "maxSkew": 1,
                "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": {"app.kubernetes.io/name": app}},
            }
        ]
    creator_meta: JsonObj = {"labels": labels, "annotations": annotations}
    if owners is not None:
        creator_meta["ownerReferences"] = owners
    creator_entry = entry(creator, CREATED, fields_v1({"metadata": creator_meta, "spec": spec}))
    scheduler_entry = entry(
        "kube-scheduler",
        SCHEDULED,
        {"f:status": {"f:conditions": {'k:{"type":"PodScheduled"}': condition_fields()}}},
        subresource="status",
    )
    status_fields = {
        phase: kubelet_fields(status_body(phase, spec, "", seed, namespace, app, profile.wide))
        for phase in ("Pending", "Running", "Succeeded", "Failed")
    }
    return _Template(labels, annotations, owners, spec, creator_entry, scheduler_entry, status_fields)


# -- one pod -------------------------------------------------------------------------------------------------


def dress(
    pod: JsonObj,
    size: PodSize,
    seed: int = 0,
    *,
    container_id: str | None = None,
    launcher: bool = False,
) -> JsonObj:
    """`pod` (a small pod of `lab.cluster.objects.pod_object`) dressed to `size`, in place; returned.

    `container_id`: the pod sandbox's id, as Calico's CNI annotates it (its handle's); `launcher`: a
    KubeVirt virt-launcher pod (created by virt-controller, no ReplicaSet)."""
    if size == "small":
        return pod
    meta, spec = pod["metadata"], pod["spec"]
    ns, name = str(meta["namespace"]), str(meta["name"])
    app = "virt-launcher" if launcher else _app_of(seed, ns, name)
    t = _template(seed, size, ns, app, launcher)
    given = dict(meta.get("annotations") or {})
    cid = container_id or digest("sandbox", seed, ns, name)
    calico = {"cni.projectcalico.org/containerID": cid}
    calico.update({k: v for k, v in given.items() if k.startswith("cni.projectcalico.org/")})
    annotations = {**t.annotations, **calico, **given}
    new_meta: JsonObj = {
        "name": name,
        "namespace": ns,
        "uid": meta["uid"],
        "labels": t.labels,
        "annotations": annotations,
    }
    if t.owner_references is not None:
        new_meta["ownerReferences"] = t.owner_references
    new_meta["creationTimestamp"] = meta["creationTimestamp"]
    for key, value in meta.items():  # anything else the small pod has (none today)
        new_meta.setdefault(key, value)
    node = str(spec.get("nodeName") or "")
    new_spec = {**t.spec, "nodeName": node} if node else dict(t.spec)
    for key, value in spec.items():
        if key not in ("containers", "nodeName"):
            new_spec[key] = value
    calico_entry = entry(
        "calico", ANNOTATED, {"f:metadata": {"f:annotations": {f"f:{k}": {} for k in calico}}}
    )
    pod["metadata"], pod["spec"] = new_meta, new_spec
    status = dressed_status(pod, pod.get("status") or {}, size, seed)
    new_meta["managedFields"] = [t.creator, t.scheduler, calico_entry, _kubelet_entry(t, status)]
    pod["status"] = status
    return pod


def _kubelet_entry(t: _Template, status: Mapping[str, Any]) -> JsonObj:
    phase = str(status.get("phase") or "Pending")
    base = t.status_fields.get(phase) or t.status_fields["Pending"]
    fields = {"f:status": dict(base["f:status"])}
    for single, many in (("hostIP", "hostIPs"), ("podIP", "podIPs")):
        if single in status:
            fields["f:status"][f"f:{single}"] = {}
        if status.get(many):
            fields["f:status"][f"f:{many}"] = fields_of(many, status[many])
    return entry(KUBELET, READY, fields, subresource="status")
