"""The house's rooms: no module of the product or the lab is past 400 lines (issue 47).
A module that grows past it is split along what its parts own, as `lab/cluster/podshape.py` and
`producer/mirror.py` were; tests are not counted (they are split by what they test)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("producer", "workers", "shared", "redisio", "kubeio", "ipamgc", "lab")
MAX_LINES = 400


def modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def test_the_packages_hold_modules() -> None:
    assert len(modules()) > 100  # the walk found the code it checks


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_is_past_400_lines(package: str) -> None:
    over = {
        str(p.relative_to(ROOT)): n
        for p in sorted((ROOT / package).rglob("*.py"))
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert over == {}, f"split these along what they own: {over}"
