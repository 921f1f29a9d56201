"""The kubelet's status of a simulated pod dressed to a size (`lab.cluster.podshape`): conditions, host IPs,
start time and container statuses, with the same phase, reason and IPs as the small pod's status.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from lab.cluster import podspec
from lab.cluster.podspec import PROFILES, digest

JsonObj = dict[str, Any]
PodSize = Literal["small", "real", "large"]  # the simulated pods' sizes (`lab.cluster.podshape` names them)

SCHEDULED = "2025-01-21T17:51:44Z"
STARTED = "2025-01-21T17:51:47Z"
READY = "2025-01-21T17:51:52Z"


def _host_ip(seed: int, node: str) -> str:
    h = bytes.fromhex(digest("host", seed, node)[:4])
    return f"10.0.{h[0]}.{max(h[1], 1)}"


def dressed_status(
    pod: Mapping[str, Any], status: Mapping[str, Any], size: PodSize, seed: int = 0
) -> JsonObj:
    """`status` (a small pod's: phase, reason, podIP(s)) as the kubelet of `pod` (dressed to `size`)
    reports it: the same phase, reason and IPs, with conditions, host IPs, start time and container
    statuses."""
    if size == "small":
        return dict(status)
    meta, spec = pod["metadata"], pod.get("spec") or {}
    node = str(spec.get("nodeName") or "")
    host = _host_ip(seed, node) if node else ""
    body = status_body(
        str(status.get("phase") or "Pending"),
        spec,
        host,
        seed,
        meta["namespace"],
        meta["name"],
        PROFILES[size].wide,
    )
    for key in ("podIP", "podIPs", "reason"):
        if key in status:
            body[key] = status[key]
    for key, value in status.items():  # anything else the small status has (none today)
        body.setdefault(key, value)
    return body


def status_body(
    phase: str, spec: Mapping[str, Any], host: str, seed: int, namespace: str, name: str, wide: bool
) -> JsonObj:
    running = phase == "Running"
    started = phase != "Pending"
    ready = "True" if running else "False"
    conditions = [
        ("PodReadyToStartContainers", "True" if started else "False"),
        ("Initialized", "True" if started else "False"),
        ("Ready", ready),
        ("ContainersReady", ready),
        ("PodScheduled", "True"),
    ]
    body: JsonObj = {
        "phase": phase,
        "conditions": [
            {
                "type": kind,
                "status": value,
                "lastProbeTime": None,
                "lastTransitionTime": SCHEDULED if kind == "PodScheduled" else READY,
            }
            for kind, value in conditions
        ],
    }
    if host:
        body["hostIP"] = host
        body["hostIPs"] = [{"ip": host}]
    body["startTime"] = SCHEDULED
    init_phase = "Succeeded" if started else "Pending"
    wide = len(spec.get("containers") or []) > 2
    if spec.get("initContainers"):
        body["initContainerStatuses"] = [
            _container_status(c, init_phase, seed, namespace, name, wide) for c in spec["initContainers"]
        ]
    body["containerStatuses"] = [
        _container_status(c, phase, seed, namespace, name, wide) for c in spec.get("containers") or []
    ]
    body["qosClass"] = "Burstable"
    return body


def _container_status(
    c: Mapping[str, Any], phase: str, seed: int, namespace: str, name: str, wide: bool
) -> JsonObj:
    container, image = str(c["name"]), str(c["image"])
    if phase == "Running":
        state: JsonObj = {"running": {"startedAt": STARTED}}
    elif phase == "Pending":
        state = {"waiting": {"reason": "PodInitializing"}}
    else:
        code = 0 if phase == "Succeeded" else 137
        state = {
            "terminated": {
                "exitCode": code,
                "reason": "Completed" if code == 0 else "Error",
                "startedAt": STARTED,
                "finishedAt": READY,
                "containerID": f"containerd://{digest('container', seed, namespace, name, container)}",
            }
        }
    out: JsonObj = {
        "name": container,
        "state": state,
        "lastState": {},
        "ready": phase == "Running",
        "restartCount": 0,
        "image": image,
        "imageID": f"{image.rsplit(':', 1)[0]}@sha256:{digest('image', image)}",
        "started": phase == "Running",
    }
    if phase != "Pending":
        out["containerID"] = f"containerd://{digest('container', seed, namespace, name, container)}"
    if wide:  # what kubelets of 1.30 and later add (large pods)
        out["volumeMounts"] = podspec.status_mounts(c)
        out["user"] = {"linux": {"uid": 10001, "gid": 10001, "supplementalGroups": [10001]}}
    return out
