"""The handle index's members (`shared.records.encode_handle_member`): ZRANGE BYLEX over one handle's
range lists exactly that handle's members, whatever the handles, fields and nodes are; anything else
in the ZSET is refused with a `RecordError`, never read as an allocation."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.codec import RecordError, pack
from shared.gcrecords import decode_handle_member, encode_handle_member, handle_member_range

text = st.text(max_size=300)


def in_range(member: bytes, handle: str) -> bool:
    """Redis's BYLEX comparison (memcmp), `[low` inclusive, `(high` exclusive."""
    low, high = handle_member_range(handle)
    assert low[:1] == b"[" and high[:1] == b"("
    return low[1:] <= member < high[1:]


@given(text, text, text)
def test_a_member_decodes_to_what_was_encoded(handle: str, field: str, node: str) -> None:
    m = encode_handle_member(handle, field, node)
    assert decode_handle_member(m) == (handle, field, node)
    assert in_range(m, handle)


@given(text, text, text, text)
def test_a_member_of_another_handle_is_never_in_a_handles_range(
    handle: str, other: str, field: str, node: str
) -> None:
    if other != handle:
        assert not in_range(encode_handle_member(other, field, node), handle)


@pytest.mark.parametrize(
    "member",
    [
        b"",
        b"\xc1",  # never used by msgpack
        pack("h") + pack("f"),  # two strings
        pack("h") + pack("f") + pack("n") + pack("x"),  # four
        pack("h") + pack(b"\xff\xfe") + pack("n"),  # a field that is bytes, not text
        pack("h") + pack(5) + pack("n"),
        pack("h") + pack("f") + pack("n") + b"\xa5",  # truncated trailing string
        bytes([0xD9, 1]) + b"h" + pack("f") + pack("n"),  # not the canonical (shortest) form
    ],
)
def test_anything_else_is_refused(member: bytes) -> None:
    with pytest.raises(RecordError):
        decode_handle_member(member)
