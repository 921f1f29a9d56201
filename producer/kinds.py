"""The resources the watcher lists and watches, and which of them gate a sync.

Why it exists: the kinds are named by every room of the producer (the reflectors, the typing of objects,
the mirror, the metrics), so they live apart from any one of them; a kind's plural is its value.
"""

from __future__ import annotations

from enum import StrEnum

from shared import kubevirt as kv


class Kind(StrEnum):
    """A listed/watched resource, by its plural."""

    NODES = "nodes"
    PODS = "pods"
    BLOCKS = "ipamblocks"
    CONTROLLERS_CONFIG = "kubecontrollersconfigurations"
    CLUSTER_INFO = "clusterinformations"
    HANDLES = "ipamhandles"
    AFFINITIES = "blockaffinities"
    VMS = "virtualmachines"  # kubevirt.io/v1, watched only while served (`producer/kubevirt.py`)
    VMIS = "virtualmachineinstances"
    IPAM_CONFIG = "ipamconfigs"  # served as `ipamconfigurations` in projectcalico.org/v3


# Kubernetes' own kinds and KubeVirt's (one group); every other one is Calico's, in the group
# `KubeApi.calico()` chose.
CORE_KINDS: dict[Kind, str] = {Kind.NODES: "Node", Kind.PODS: "Pod"}
KUBEVIRT_KINDS: dict[Kind, str] = {Kind.VMS: kv.VM_KIND, Kind.VMIS: kv.VMI_KIND}
WATCHED = (
    Kind.NODES,
    Kind.PODS,
    Kind.BLOCKS,
    Kind.CONTROLLERS_CONFIG,
    Kind.CLUSTER_INFO,
    Kind.IPAM_CONFIG,
)
# What the mirror must have listed before anything is decided: the IPAMConfig is not among them (only
# the leader's cooldown follows it, and it keeps its own live read when the mirror has none).
SYNC_GATED = tuple(k for k in WATCHED if k is not Kind.IPAM_CONFIG)
INVENTORY = (Kind.NODES, Kind.PODS, Kind.BLOCKS, Kind.HANDLES, Kind.AFFINITIES)
# The kinds whose list items and watch events are typed straight from their bytes (`producer.typed`).
FAST_KINDS = frozenset({Kind.PODS, Kind.BLOCKS})
