"""One-shot reads of a live cluster: the inventory `ipamgc check --kubeconfig` audits, and the
pre-flight probe of `ipamgc up`.

Why it exists: these read the cluster once, read-only, outside the watcher's reflectors, with a few
retries and one-line errors for a person at a terminal.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import urllib3

from kubeio.client import ApiClient, api_client
from kubeio.errors import translate
from kubeio.watch import Backoff
from producer.kinds import INVENTORY, Kind
from producer.kube import KubeApi
from shared.calicogroup import CalicoGroup
from shared.errors import TransientError


def fetch_live_inventory(
    kubeconfig: str | None,
    context: str | None = None,
    attempts: int = 3,
    kubevirt: Callable[[ApiClient], bool | None] | None = None,
    calico: CalicoGroup | None = None,
) -> list[dict[str, Any]]:
    """Every node, pod, IPAMBlock, IPAMHandle and BlockAffinity of a live cluster, read-only, as raw
    objects with `kind`/`apiVersion` set (lists omit them), ready for `shared.snapshot.build_inventory`;
    and its KubeVirt VMs and VMIs when `kubevirt` (`producer.kubevirt.discover`) says they are served.
    Calico's objects come from `calico`, else from the group the server's discovery says."""
    client = api_client(kubeconfig, context)
    try:
        api = KubeApi(client, calico=calico)
        out: list[dict[str, Any]] = []
        kinds: tuple[Kind, ...] = INVENTORY
        if kubevirt is not None and kubevirt(client):
            kinds = (*INVENTORY, Kind.VMS, Kind.VMIS)
        for kind in kinds:
            backoff = Backoff(0.5, 5.0)
            for attempt in range(attempts):
                try:
                    object_kind, api_version = api.object_kind(kind)
                    items, _ = api.items(kind)
                    break
                except TransientError:
                    if attempt == attempts - 1:
                        raise
                    time.sleep(backoff.next())
            for item in items:
                item.setdefault("kind", object_kind)
                item.setdefault("apiVersion", api_version)
            out.extend(items)
        return out
    finally:
        client.close()


def probe_cluster(
    kubeconfig: str | None,
    context: str | None = None,
    timeout: float = 5.0,
    calico: CalicoGroup | None = None,
) -> None:
    """One `limit=1` list of nodes, pods and IPAMBlocks, for `ipamgc up`'s pre-flight check: proves the
    kubeconfig loads, the API answers, the credentials may list, and Calico's CRDs are installed (in
    `calico`, else the discovered group).
    Raises ConfigError, KubePermanentError (401, 403, 404) or KubeTransientError, each one line."""
    client = api_client(kubeconfig, context)
    try:
        api = KubeApi(client, calico=calico, connect_timeout=timeout, list_timeout=timeout)
        for kind in (Kind.NODES, Kind.PODS, Kind.BLOCKS):
            resp = api._call(kind, "list", {"limit": "1"}, (timeout, timeout))
            try:
                _ = resp.data  # read the body whole: the connection goes back to the pool clean
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                raise translate(exc, f"list {kind}: reading the body") from exc
            finally:
                resp.release_conn()
    finally:
        client.close()
