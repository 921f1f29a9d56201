"""The records ipamgc mirrors into Redis, and their msgpack form (version tag first, then positional fields).

Records hold only what validation and release read, so Redis memory follows the allocation count and not
the size of Kubernetes objects: an allocation keeps its GC attributes (`node`, `namespace`, `pod`, `type`,
`vmi-name`; the CNI timestamp is dropped), a pod its slim fields, a node its uid and the flannel-migration
label.  The key that stores a record carries its identity (alloc id `<handle>/<ip>`, pod `<ns>/<name>`,
node name, block CIDR), so it is not repeated inside.  Decoding bad bytes raises a `shared.codec`
`RecordError`.  Layouts are described per function; bump the version when one changes.

This module holds the layouts of the mirrored cluster objects (allocations, pods, nodes, KubeVirt VMs and
VMIs).  The block layouts, the watcher's hot path, live in `shared.blockrecords`, and the records ipamgc
writes of its own (candidate timers, decided markers, decisions, the empty-block and handle indexes) in
`shared.gcrecords`; each is imported from where it is defined.
"""

from __future__ import annotations

from typing import Any

import msgspec

from shared.blockrecords import (
    gc_attrs,
)
from shared.codec import (
    WrongRecordShape,
    as_bool,
    as_int,
    as_str,
    as_str_list,
    as_str_map,
    pack,
    unpack_record,
)
from shared.kubevirt import VirtualMachine, VirtualMachineInstance
from shared.model import (
    LABEL_NODE_NETWORK_DURING_MIGRATION,
    Allocation,
    Node,
    Pod,
)

VERSION = 1

# The records the workers and the leader read most (an allocation and its pod per id validated) decoded
# straight into their typed fields: msgspec checks the array's length and every field's type in C (~0.7 µs
# where the generic unpack and the per-field checks below took 7-10 µs; a cold start at 150k pods reads
# 150,000 of each).  Whatever it refuses (another version, a wrong shape, bytes that are not msgpack) is
# read again by the generic path, whose error names the field: one message whichever path saw it first.
_ALLOCATION = msgspec.msgpack.Decoder(tuple[int, str, int, int, dict[str, str]])
_POD = msgspec.msgpack.Decoder(tuple[int, str, str, str, str, str, list[str], dict[str, str], bool, bool])
_NODE = msgspec.msgpack.Decoder(tuple[int, str, dict[str, str]])


def _typed(decoder: msgspec.msgpack.Decoder[Any], data: object) -> Any:
    """`decoder`'s tuple for a record of this code's version, else None (the caller's generic path then
    raises the precise `RecordError`)."""
    if not isinstance(data, bytes):
        return None
    try:
        fields = decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return fields if fields[0] == VERSION else None


# The node labels the rules read (empty-block release during flannel migration).
NODE_LABELS = (LABEL_NODE_NETWORK_DURING_MIGRATION,)


def split_alloc_id(alloc_id: str) -> tuple[str, str]:
    """`<handle>/<ip>` → (handle, ip).  IPs hold no `/`, so the last one separates them."""
    handle, sep, ip = alloc_id.rpartition("/")
    if not sep or not handle or not ip:
        raise WrongRecordShape("allocation", f"bad allocation id {alloc_id!r}")
    return handle, ip


# -- allocation: [v, block, ordinal, sequence number, gc attrs] ------------------------------------------


def encode_allocation(a: Allocation) -> bytes:
    return pack([VERSION, a.block, a.ordinal, a.sequence_number, gc_attrs(a.attrs)])


def decode_allocation(alloc_id: str, data: bytes) -> Allocation:
    handle, ip = split_alloc_id(alloc_id)
    t = _typed(_ALLOCATION, data)
    if t is not None:
        return Allocation(ip=ip, ordinal=t[2], block=t[1], handle=handle, attrs=t[4], sequence_number=t[3])
    return checked_allocation(alloc_id, data)


def checked_allocation(alloc_id: str, data: bytes) -> Allocation:
    """`decode_allocation` through the generic path alone (its errors name the field)."""
    kind = "allocation"
    handle, ip = split_alloc_id(alloc_id)
    v = unpack_record(kind, data, VERSION, 5)
    return Allocation(
        ip=ip,
        ordinal=as_int(kind, "ordinal", v[2]),
        block=as_str(kind, "block", v[1]),
        handle=handle,
        attrs=as_str_map(kind, "attrs", v[4]),
        sequence_number=as_int(kind, "sequence number", v[3]),
    )


# -- pod: [v, uid, nodeName, phase, reason, podIP, podIPs, annotations, being deleted, hostNetwork] --------


def encode_pod(pod: Pod) -> bytes:
    return pack(
        [
            VERSION,
            pod.uid,
            pod.node_name,
            pod.phase,
            pod.reason,
            pod.pod_ip,
            list(pod.pod_ips),
            dict(sorted(pod.annotations.items())),  # one order, however the object listed them
            pod.deletion_timestamp,
            pod.host_network,
        ]
    )


def decode_pod(namespace: str, name: str, data: bytes) -> Pod:
    t = _typed(_POD, data)
    if t is not None:
        return Pod(
            namespace=namespace,
            name=name,
            uid=t[1],
            node_name=t[2],
            phase=t[3],
            reason=t[4],
            pod_ip=t[5],
            pod_ips=tuple(t[6]),
            annotations=t[7],
            deletion_timestamp=t[8],
            host_network=t[9],
        )
    return checked_pod(namespace, name, data)


def checked_pod(namespace: str, name: str, data: bytes) -> Pod:
    """`decode_pod` through the generic path alone (its errors name the field)."""
    kind = "pod"
    v = unpack_record(kind, data, VERSION, 10)
    return Pod(
        namespace=namespace,
        name=name,
        uid=as_str(kind, "uid", v[1]),
        node_name=as_str(kind, "nodeName", v[2]),
        phase=as_str(kind, "phase", v[3]),
        reason=as_str(kind, "reason", v[4]),
        pod_ip=as_str(kind, "podIP", v[5]),
        pod_ips=tuple(as_str_list(kind, "podIPs", v[6])),
        annotations=as_str_map(kind, "annotations", v[7]),
        deletion_timestamp=as_bool(kind, "deletionTimestamp", v[8]),
        host_network=as_bool(kind, "hostNetwork", v[9]),
    )


# -- node: [v, uid, kept labels] ---------------------------------------------------------------------------


def encode_node(node: Node) -> bytes:
    labels = {k: node.labels[k] for k in NODE_LABELS if k in node.labels}
    return pack([VERSION, node.uid, labels])


def decode_node(name: str, data: bytes) -> Node:
    t = _typed(_NODE, data)
    if t is not None:
        return Node(name=name, uid=t[1], labels=t[2])
    return checked_node(name, data)


def checked_node(name: str, data: bytes) -> Node:
    """`decode_node` through the generic path alone (its errors name the field)."""
    kind = "node"
    v = unpack_record(kind, data, VERSION, 3)
    return Node(name=name, uid=as_str(kind, "uid", v[1]), labels=as_str_map(kind, "labels", v[2]))


# -- KubeVirt (only what the VM rule reads, `shared/kubevirt.py`): VM [v]; VMI [v, owned by a VM] --------


def encode_vm(vm: VirtualMachine) -> bytes:
    return pack([VERSION])


def decode_vm(data: bytes) -> None:
    """Checks a VM record (it says only that the VM exists)."""
    unpack_record("vm", data, VERSION, 1)


def encode_vmi(vmi: VirtualMachineInstance) -> bytes:
    return pack([VERSION, vmi.owned_by_vm])


def decode_vmi(data: bytes) -> bool:
    """Whether the VMI is owned by a VirtualMachine."""
    v = unpack_record("vmi", data, VERSION, 2)
    return as_bool("vmi", "owned by vm", v[1])
