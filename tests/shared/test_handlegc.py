"""The handle collector's rule, pure (shared/consistency.py, shared/handlegc.py): the classes, the
Windows-reserved handle, the history of observations, and the two conditions (passes and grace)."""

from __future__ import annotations

from ipaddress import ip_network

from shared.consistency import HandleClass, classify_handle, handle_divergences
from shared.handlegc import Action, action_for, confirm, earliest_repair, observe
from shared.model import Attribute, IPAMBlock, IPAMHandle

CIDR = "10.244.0.0/30"


def _block(*handles: str | None) -> IPAMBlock:
    attrs = tuple(Attribute(h) for h in handles)
    allocations = tuple(range(len(handles))) + (None,) * (4 - len(handles))
    return IPAMBlock(
        name="10-244-0-0-30",
        cidr=ip_network(CIDR),
        affinity="host:node-a",
        allocations=allocations,
        unallocated=tuple(range(len(handles), 4)),
        attributes=attrs,
        sequence_number=0,
        sequence_number_for_allocation={},
    )


def _handle(name: str, counts: dict[str, int], deleted: bool = False, rv: str = "1") -> IPAMHandle:
    return IPAMHandle(name=name.lower(), handle_id=name, block=counts, deleted=deleted, resource_version=rv)


def test_each_class() -> None:
    assert classify_handle(None, {}) is None
    assert classify_handle(None, {CIDR: 1}) is HandleClass.MISSING
    assert classify_handle(_handle("h", {CIDR: 1}), {CIDR: 1}) is None
    assert classify_handle(_handle("h", {CIDR: 1, "10.9.0.0/26": 0}), {CIDR: 1}) is None  # 0: no entry
    assert classify_handle(_handle("h", {CIDR: 2}), {CIDR: 1}) is HandleClass.SKEWED
    assert classify_handle(_handle("h", {CIDR: 1}), {}) is HandleClass.ORPHAN
    assert classify_handle(_handle("h", {}), {}) is HandleClass.ORPHAN
    assert classify_handle(_handle("h", {CIDR: 1}, deleted=True), {CIDR: 1}) is HandleClass.STUCK_DELETED


def test_the_actions_never_delete_a_handle_that_still_counts() -> None:
    [orphan] = handle_divergences([_block()], {"h": _handle("h", {CIDR: 1})})
    assert action_for(orphan) is Action.EMPTY
    [empty] = handle_divergences([_block()], {"h": _handle("h", {})})
    assert action_for(empty) is Action.DELETE
    [missing] = handle_divergences([_block("H")], {})
    assert action_for(missing) is Action.CREATE and missing.handle_id == "H" and missing.name == "h"


def test_windows_reserved_and_unreadable_handles_are_never_judged() -> None:
    block = _block("windows-reserved-ipam-handle", "a", "b")
    handles = {"windows-reserved-ipam-handle": _handle("windows-reserved-ipam-handle", {})}
    assert [d.name for d in handle_divergences([block], handles, unreadable={"b"})] == ["a"]


def test_a_handle_id_spelled_in_two_cases_is_refused() -> None:
    [d] = handle_divergences([_block("Pod", "pod")], {})
    assert d.ambiguous
    [obs] = observe({}, [d], 0.0).values()
    assert confirm(obs, d) is not None


def test_both_conditions_passes_and_grace_and_any_change_restarts() -> None:
    handles = {"h": _handle("h", {CIDR: 2})}
    blocks = [_block("h")]
    history = observe({}, handle_divergences(blocks, handles), 0.0)
    history = observe(history, handle_divergences(blocks, handles), 10_000.0)
    assert not history["h"].due(10_000.0, 900.0)  # two scans, however long
    history = observe(history, handle_divergences(blocks, handles), 10_001.0)
    assert history["h"].passes == 3 and history["h"].due(10_001.0, 900.0)
    assert not history["h"].due(899.0, 900.0)
    touched = {"h": _handle("h", {CIDR: 2}, rv="2")}  # same counts, written again
    history = observe(history, handle_divergences(blocks, touched), 10_002.0)
    assert history["h"].passes == 1 and history["h"].first_seen == 10_002.0
    history = observe(history, handle_divergences(blocks, {"h": _handle("h", {CIDR: 1})}), 10_003.0)
    assert history == {}  # in step again: forgotten


def test_confirm_wants_the_evidence_unchanged() -> None:
    [d] = handle_divergences([_block("h")], {"h": _handle("h", {CIDR: 2})})
    [obs] = observe({}, [d], 0.0).values()
    assert confirm(obs, d) is None
    assert confirm(obs, None) is not None
    [moved] = handle_divergences([_block("h", "h")], {"h": _handle("h", {CIDR: 3})})
    assert "changed since first seen" in (confirm(obs, moved) or "")


def test_earliest_repair() -> None:
    assert earliest_repair(900.0, 300.0) == 900.0
    assert earliest_repair(60.0, 300.0) == 600.0
