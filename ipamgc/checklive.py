"""What `ipamgc check --kubeconfig` reads of a live cluster besides its IPAM objects: the leak grace period
the running collector uses, read as the watcher reads it.

The watcher takes KubeControllersConfiguration `default`'s `spec.controllers.node.leakGracePeriod`
(`producer.typed.convert`: unset, or malformed, is Calico's unset: nothing collected on live nodes), and
Calico's 15m (`IPAMGC_DEFAULT_LEAK_GRACE_PERIOD`) when there is no `default` (`producer/publisher.py`).
`check` judges with the same value, so its `after-grace` says what the running system will do.
"""

from __future__ import annotations

from collections.abc import Mapping

from producer.kinds import Kind
from producer.kube import KubeApi, api_client, list_calico_items
from producer.typed import ControllersConfig, convert
from shared.calicogroup import CalicoGroup
from shared.config import Settings, from_env
from shared.errors import ConfigError

KCC_NAME = "default"


def default_grace() -> float:
    """The watcher's grace without a KubeControllersConfiguration `default`."""
    try:
        return from_env().default_leak_grace_seconds
    except ConfigError:
        return Settings().default_leak_grace_seconds


def grace_of(items: list[object]) -> tuple[float | None, str]:
    """The grace period the watcher would use given these KubeControllersConfigurations, and whence."""
    for raw in items:
        meta = raw.get("metadata") if isinstance(raw, Mapping) else None
        if isinstance(meta, Mapping) and meta.get("name") == KCC_NAME:
            typed = convert(Kind.CONTROLLERS_CONFIG, raw)
            cfg = typed.obj if isinstance(typed.obj, ControllersConfig) else None
            grace = cfg.leak_grace if cfg is not None else None
            return grace, "the cluster's KubeControllersConfiguration default, as the collector reads it"
    return default_grace(), "Calico's default: the cluster has no KubeControllersConfiguration default"


def read_kccs(kubeconfig: str | None, context: str | None, calico: CalicoGroup | None) -> list[object]:
    """The live cluster's KubeControllersConfigurations, raw (one list; errors are raised): `grace_of`
    them, and `ipamgc.calicoswitch.calico_collector` them."""
    client = api_client(kubeconfig, context)
    try:
        return list_calico_items(KubeApi(client, calico=calico), "kubecontrollersconfigurations")
    finally:
        client.close()


def cluster_grace(
    kubeconfig: str | None, context: str | None, calico: CalicoGroup | None
) -> tuple[float | None, str]:
    """`grace_of` the live cluster's KubeControllersConfigurations."""
    return grace_of(read_kccs(kubeconfig, context, calico))
