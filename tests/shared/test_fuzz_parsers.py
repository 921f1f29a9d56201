"""Fuzzing every edge that reads untrusted input: arbitrary JSON (and near-valid objects with one field
broken) into the Kubernetes/Calico parsers, arbitrary bytes and msgpack values into the Redis record
decoders, arbitrary documents into `ipamgc check`'s snapshot loading.  Each gives a value or its named
error (`MalformedObject`, `RecordError`, `SnapshotError`), never any other exception."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import msgpack
import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ipamgc.check import load, read_items
from lab.cluster.objects import ClusterBuilder
from producer.kinds import Kind
from producer.typed import convert
from shared import blockrecords, gcrecords, records
from shared.audit import audit
from shared.codec import RecordError
from shared.errors import BadPodIP, MalformedObject, SnapshotError
from shared.parse import parse_affinity, parse_block, parse_handle, parse_node, parse_pod
from shared.snapshot import build_inventory

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["10.0.0.0/26", "10.0.0.1/26", "fd00::/122", "²", "١٢", "-1", "host:", "host:n", "x:y"]),
)
# Keys as they come: text, and the digits Python's str.isdigit() accepts but int() does not.
keys = st.one_of(st.text(max_size=12), st.sampled_from(["0", "63", "64", "-1", "²", "٣", "1_0", " 1", "0x1"]))
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(keys, inner, max_size=6),
    max_leaves=30,
)


def _good_objects() -> dict[str, dict[str, Any]]:
    b = ClusterBuilder()
    b.add_node("node-1")
    b.add_pod("default", "web-0", "node-1", dual_stack=True)
    snap = b.snapshot()["items"]
    by_kind: dict[str, dict[str, Any]] = {}
    for obj in snap:
        by_kind.setdefault(obj["kind"], obj)
    return by_kind


GOOD = _good_objects()
PARSERS = {
    "IPAMBlock": parse_block,
    "Pod": parse_pod,
    "Node": parse_node,
    "IPAMHandle": parse_handle,
    "BlockAffinity": parse_affinity,
}


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def broken(draw: st.DrawFn, kind: str) -> Any:
    """A valid object of `kind` with one value anywhere in it replaced (or one key removed)."""
    obj = copy.deepcopy(GOOD[kind])
    paths = [p for p in _paths(obj) if p]
    path = draw(st.sampled_from(paths))
    parent = obj
    for step in path[:-1]:
        parent = parent[step]
    action = draw(st.sampled_from(["replace", "delete", "rename"]))
    if isinstance(parent, dict) and action == "delete":
        del parent[path[-1]]
    elif isinstance(parent, dict) and action == "rename":
        parent[draw(keys)] = parent.pop(path[-1])
    else:
        parent[path[-1]] = draw(json_values)
    return obj


def _parse(kind: str, raw: Any) -> None:
    try:
        PARSERS[kind](raw)
    except MalformedObject as exc:
        assert exc.kind == kind and exc.code and isinstance(exc.name, str)


@FUZZ
@given(kind=st.sampled_from(sorted(PARSERS)), raw=json_values)
def test_parsers_take_any_json(kind: str, raw: Any) -> None:
    _parse(kind, raw)


@FUZZ
@given(data=st.data(), kind=st.sampled_from(sorted(PARSERS)))
def test_parsers_take_near_valid_objects(data: st.DataObject, kind: str) -> None:
    _parse(kind, data.draw(broken(kind)))


@FUZZ
@given(data=st.data(), kind=st.sampled_from([Kind.PODS, Kind.NODES, Kind.BLOCKS]))
def test_the_watchers_converter_keeps_ips_for_any_object(data: st.DataObject, kind: Kind) -> None:
    """The watcher's edge never raises: an object is typed, or replaced by what keeps IPs."""
    source = {Kind.PODS: "Pod", Kind.NODES: "Node", Kind.BLOCKS: "IPAMBlock"}[kind]
    raw = data.draw(st.one_of(json_values, broken(source)))
    typed = convert(kind, raw)
    if typed.problem is not None and kind is Kind.BLOCKS:
        assert typed.obj is None  # an unparsable block: the mirrored version stays
    if isinstance(typed.problem, BadPodIP) and typed.problem.pod is not None:
        assert typed.obj is typed.problem.pod  # only an IP is bad: the pod, its IPs unparsed (as Calico)
    elif typed.problem is not None and kind is Kind.PODS and typed.obj is not None:
        assert typed.obj.pod_ips == () and typed.obj.pod_ip == ""  # a stand-in pod: "no IP yet", valid


DECODERS = {
    "allocation": lambda b: records.decode_allocation("k8s-pod-network.abc/10.0.0.1", b),
    "block": blockrecords.decode_block,
    "block version": blockrecords.decode_block_version,
    "handle index member": gcrecords.decode_handle_member,
    "pod": lambda b: records.decode_pod("default", "web-0", b),
    "node": lambda b: records.decode_node("node-1", b),
    "candidate": gcrecords.decode_candidate,
    "decided": gcrecords.decode_decided,
    "decision": gcrecords.decode_decision,
}
msgpack_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**63), max_value=2**64 - 1),
        st.floats(),
        st.text(max_size=10),
        st.binary(max_size=10),
    ),
    lambda inner: (
        st.lists(inner, max_size=17)
        | st.dictionaries(st.integers(0, 70) | st.text(max_size=5), inner, max_size=5)
    ),
    max_leaves=40,
)


def _decode(name: str, data: bytes) -> None:
    try:
        DECODERS[name](data)
    except RecordError as exc:
        assert exc.kind and exc.code


@FUZZ
@given(name=st.sampled_from(sorted(DECODERS)), data=st.binary(max_size=200))
def test_record_decoders_take_any_bytes(name: str, data: bytes) -> None:
    _decode(name, data)


@FUZZ
@given(name=st.sampled_from(sorted(DECODERS)), value=msgpack_values, tag=st.sampled_from([1, 1, 1, 0, 2, -1]))
def test_record_decoders_take_any_msgpack(name: str, value: Any, tag: int) -> None:
    """Values shaped like records (a version tag first, the right arity) with anything in the fields."""
    _decode(name, msgpack.packb(value, use_bin_type=True))
    if isinstance(value, list):
        arity = {"allocation": 5, "block": 6, "pod": 10, "node": 3, "candidate": 3, "decided": 3}.get(
            name, 16
        )
        fields = (value * arity)[: arity - 1] if value else [None] * (arity - 1)
        _decode(name, msgpack.packb([tag, *fields], use_bin_type=True))


@FUZZ
@given(data=st.binary(max_size=120))
def test_record_decoders_take_truncations_of_real_records(data: bytes) -> None:
    good = blockrecords.encode_block(blockrecords.block_record(parse_block(GOOD["IPAMBlock"])))
    for cut in (len(good) // 3, len(good) - 1, len(data) % max(1, len(good))):
        _decode("block", good[:cut])
        _decode("block", good[:cut] + data)


@FUZZ
@given(doc=json_values)
def test_check_snapshot_loading_takes_any_document(doc: Any, tmp_path_factory: Any) -> None:
    path = Path(tmp_path_factory.mktemp("snap")) / "snapshot.json"
    path.write_bytes(orjson.dumps(doc, option=orjson.OPT_NON_STR_KEYS) if _jsonable(doc) else b"\xff{")
    try:
        inv = load([str(path)])
    except SnapshotError as exc:
        assert str(exc)
        return
    audit(inv, 900.0)


@FUZZ
@given(
    data=st.data(),
    kinds=st.lists(st.sampled_from(sorted(PARSERS)), min_size=1, max_size=6),
)
def test_an_inventory_of_broken_objects_is_audited_without_error(
    data: st.DataObject, kinds: list[str]
) -> None:
    items: list[Any] = [copy.deepcopy(o) for o in GOOD.values()]
    items += [data.draw(broken(k)) for k in kinds]
    items += [data.draw(json_values)]
    inv = build_inventory(items)
    report = audit(inv, 900.0)
    assert report is not None


def test_unreadable_snapshot_files_are_a_snapshot_error(tmp_path: Path) -> None:
    for content in (b"", b"\xff\xfe", b"[1, 2", b"42", b'{"items": 3}', b"null"):
        path = tmp_path / "s.json"
        path.write_bytes(content)
        try:
            read_items(str(path))
        except SnapshotError:
            continue
        raise AssertionError(f"{content!r} was accepted")


def _jsonable(doc: Any) -> bool:
    try:
        orjson.dumps(doc, option=orjson.OPT_NON_STR_KEYS)
    except (TypeError, orjson.JSONEncodeError):
        return False
    return True


WEIRD_KEYS = ["²", "٣", "-1", " 1", "1_0", "0x1", "", "64", "9" * 30]


def test_parsers_take_every_key_renamed_to_a_weird_number() -> None:
    """Exhaustively: each key of each mapping in a valid object renamed to a key that str.isdigit()
    may accept but int() may not (superscripts, other scripts' digits, underscores, huge numbers)."""
    for kind, good in GOOD.items():
        for path in _paths(good):
            node = good
            for step in path:
                node = node[step]
            if not isinstance(node, dict):
                continue
            for key in list(node):
                for weird in WEIRD_KEYS:
                    obj = copy.deepcopy(good)
                    target = obj
                    for step in path:
                        target = target[step]
                    target[weird] = target.pop(key)
                    _parse(kind, obj)
