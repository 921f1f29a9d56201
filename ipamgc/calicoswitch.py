"""Is Calico's own collector still collecting leaks on live nodes?  What `ipamgc check --kubeconfig` says
about the switch from Calico's collector to ipamgc (docs/operations.md, "Running beside Calico's
collector").

Why it reads the status and not only the spec: calico-kube-controllers writes the configuration it runs
with into KubeControllersConfiguration `default`'s `status.runningConfig` (its environment merged with the
spec); the spec is what someone asked for, and tigera-operator or a GitOps controller may put it back.
Calico's node controller collects leaks on live nodes only with `leakGracePeriod` set (release-v3.33's
`runconfig.go`: unset keeps its timer off); a grace of 0 never confirms a leak (its `markLeak`, ipamgc's
`shared/allocrules.py`).  It cleans up deleted nodes in every case, which is harmless beside ipamgc.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shared.config import parse_grace
from shared.errors import ConfigError

KCC_NAME = "default"


@dataclass(frozen=True, slots=True)
class CollectorState:
    """`collecting`: True (collects live-node leaks), False (does not), None (cannot tell)."""

    collecting: bool | None
    running: str | None  # status.runningConfig.controllers.node.leakGracePeriod, "" when unset
    spec: str | None  # spec.controllers.node.leakGracePeriod, "" when unset
    line: str  # one line for a person

    def to_json(self) -> dict[str, Any]:
        return {"collecting": self.collecting, "running": self.running, "spec": self.spec, "says": self.line}


def _node(doc: object, *path: str) -> Mapping[str, Any] | None:
    for key in path:
        if not isinstance(doc, Mapping):
            return None
        doc = doc.get(key)
    return doc if isinstance(doc, Mapping) else None


def _grace(node: Mapping[str, Any] | None) -> str | None:
    """The node controller's leakGracePeriod: None without a node controller, "" when unset."""
    if node is None:
        return None
    value = node.get("leakGracePeriod")
    return "" if value in (None, "") else str(value)


def _collects(grace: str) -> bool | None:
    if grace == "":
        return False
    try:
        seconds = parse_grace(grace).seconds
    except (ConfigError, ValueError):
        return None
    return seconds is not None and seconds > 0


def calico_collector(kccs: list[object]) -> CollectorState:
    """What Calico's collector does, from the cluster's KubeControllersConfigurations."""
    kcc = next(
        (k for k in kccs if isinstance(k, Mapping) and (_node(k, "metadata") or {}).get("name") == KCC_NAME),
        None,
    )
    if kcc is None:
        return CollectorState(
            None, None, None,
            "no KubeControllersConfiguration default: calico-kube-controllers creates one with "
            "leakGracePeriod 15m when it starts, and then collects",
        )  # fmt: skip
    status = _node(kcc, "status", "runningConfig")
    spec = _grace(_node(kcc, "spec", "controllers", "node"))
    if status is None:
        return CollectorState(
            None, None, spec,
            "KubeControllersConfiguration default has no status.runningConfig: calico-kube-controllers is "
            f"not running, or older (spec.leakGracePeriod: {spec or 'unset'})",
        )  # fmt: skip
    running = _grace(_node(status, "controllers", "node"))
    differs = (
        f"; the spec says {spec or 'unset'}: not applied yet, or set back by tigera-operator or GitOps"
        if spec is not None and running is not None and spec != running
        else ""
    )
    if running is None:
        return CollectorState(
            False, None, spec, f"Calico's node controller is off: it collects nothing{differs}"
        )
    collecting = _collects(running)
    if collecting:
        line = f"Calico IS collecting leaks on live nodes (running leakGracePeriod {running}){differs}"
    elif collecting is False and running == "":
        line = f"Calico collects no leaks on live nodes (running leakGracePeriod unset){differs}"
    elif collecting is False:
        line = f"Calico confirms no leak on live nodes (running leakGracePeriod {running}){differs}"
    else:
        line = f"Calico's running leakGracePeriod {running!r} is unreadable{differs}"
    return CollectorState(collecting, running, spec, line)
