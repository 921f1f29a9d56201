"""msgpack framing for every record ipamgc keeps in Redis, and the errors a bad record raises.

A record is a msgpack array whose first element is an integer version tag.  Anything that can be wrong
with bytes read back from Redis (truncated, not msgpack, not an array, an unknown version, a field of the
wrong type) raises a `RecordError`, a `PermanentError`: the caller logs it, counts it and skips the
record; it never crashes a loop and never becomes a release.  The typed records themselves are in
`shared/records.py`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import msgpack  # type: ignore[import-untyped]
import msgspec

from shared.errors import PermanentError


class RecordError(PermanentError):
    """Bytes in Redis that cannot be trusted as a record of `kind`."""

    code = "bad-record"

    def __init__(self, kind: str, detail: str) -> None:
        self.kind = kind
        self.detail = detail
        super().__init__(f"{kind} record: {self.code}: {detail}")


class TruncatedRecord(RecordError):
    code = "truncated"


class NotMsgpack(RecordError):
    code = "not-msgpack"


class UnknownRecordVersion(RecordError):
    code = "unknown-version"


class WrongRecordShape(RecordError):
    code = "wrong-shape"


# msgspec's encoder writes the same bytes as `msgpack.packb(obj, use_bin_type=True)` (the smallest form of
# every int, str and container; float64; str and bin apart) in a quarter of the time: ~0.15 µs against
# ~0.6 µs for a slot, and the watcher packs five records per allocation that changes.
_encoder = msgspec.msgpack.Encoder()


def pack(obj: object) -> bytes:
    """msgpack with the str/bin distinction kept."""
    return _encoder.encode(obj)


def unpack(kind: str, data: bytes) -> object:
    """Decode one msgpack value; integer map keys allowed (block ordinals)."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise WrongRecordShape(kind, f"expected bytes, got {type(data).__name__}")
    if not data:
        raise TruncatedRecord(kind, "empty value")
    try:
        return cast(object, msgpack.unpackb(data, raw=False, strict_map_key=False, use_list=True))
    except msgpack.exceptions.ExtraData as exc:
        raise NotMsgpack(kind, "trailing bytes after the record") from exc
    except (ValueError, TypeError, msgpack.exceptions.UnpackException) as exc:
        text = str(exc)
        if "incomplete" in text:
            raise TruncatedRecord(kind, text) from exc
        raise NotMsgpack(kind, text) from exc


def unpack_record(kind: str, data: bytes, version: int, arity: int) -> list[Any]:
    """Decode a record array tagged `version` with exactly `arity` elements (the tag included)."""
    return record_fields(kind, unpack(kind, data), version, arity)


def record_fields(kind: str, value: object, version: int, arity: int) -> list[Any]:
    """`unpack_record`'s checks on a value already unpacked."""
    if not isinstance(value, list) or not value:
        raise WrongRecordShape(kind, f"expected a non-empty array, got {type(value).__name__}")
    tag = value[0]
    if isinstance(tag, bool) or not isinstance(tag, int):
        raise WrongRecordShape(kind, f"version tag is {tag!r}")
    if tag != version:
        raise UnknownRecordVersion(kind, f"version {tag}, this code reads {version}")
    if len(value) != arity:
        raise WrongRecordShape(kind, f"{len(value)} elements, expected {arity}")
    return value


# -- field checks (each raises WrongRecordShape naming the field) -----------------------------------------


def as_str(kind: str, field: str, value: object) -> str:
    if not isinstance(value, str):
        raise WrongRecordShape(kind, f"{field} is a {type(value).__name__}, not a string")
    return value


def as_opt_str(kind: str, field: str, value: object) -> str | None:
    return None if value is None else as_str(kind, field, value)


def as_int(kind: str, field: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise WrongRecordShape(kind, f"{field} is a {type(value).__name__}, not an integer")
    return value


def as_float(kind: str, field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise WrongRecordShape(kind, f"{field} is a {type(value).__name__}, not a number")
    return float(value)


def as_bool(kind: str, field: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise WrongRecordShape(kind, f"{field} is a {type(value).__name__}, not a boolean")
    return value


def as_str_map(kind: str, field: str, value: object) -> dict[str, str]:
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise WrongRecordShape(kind, f"{field} is not a map of strings")
    return dict(value)


def as_str_list(kind: str, field: str, value: object) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise WrongRecordShape(kind, f"{field} is not a list of strings")
    return list(value)
