"""The handle collector's scan holds one page of raw JSON at a time, and a list restarted after an expired
continue token (410) counts each handle once."""

from __future__ import annotations

from typing import Any

from kubeio.errors import ResourceExpired
from workers.leader.calico_objects import BLOCKS, HANDLES
from workers.leader.handle_scan import scan


def _handle(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "crd.projectcalico.org/v1",
        "kind": "IPAMHandle",
        "metadata": {"name": name, "resourceVersion": "1"},
        "spec": {"handleID": name, "block": {"10.0.0.0/26": 1}},
    }


class _Pages:
    """`list_page` over pages of two, expiring the handles' second page once."""

    def __init__(self, names: list[str]) -> None:
        self.pages = [[_handle(n) for n in names[i : i + 2]] for i in range(0, len(names), 2)]
        self.expired = False
        self.calls: list[tuple[str, str]] = []

    def list_page(self, plural: str, page: int, cont: str) -> tuple[list[dict[str, Any]], str]:
        self.calls.append((plural, cont))
        if plural == BLOCKS:
            return [], ""
        assert plural == HANDLES
        index = int(cont or 0)
        if index == 1 and not self.expired:
            self.expired = True
            raise ResourceExpired("continue token expired")
        nxt = str(index + 1) if index + 1 < len(self.pages) else ""
        return self.pages[index], nxt


def test_a_list_restarted_after_a_410_counts_each_handle_once() -> None:
    names = ["h1", "h2", "h3", "h4", "h5"]
    api = _Pages(names)
    out = scan(api, 2)  # type: ignore[arg-type]  # the one method the scan calls
    assert api.expired
    assert sorted(out.handles) == names
    assert not out.blocks and not out.unreadable
    # handles: page 0, page 1 (410), then pages 0, 1, 2 again; blocks: one page
    assert out.requests == len(api.calls) == 6
