"""The house's rooms: no module of the product, the lab or the tests is past 400 lines (issue 47).
A module that grows past it is split along what its parts own, as `lab/cluster/podshape.py` and
`producer/mirror.py` were; a test module along what its parts test (one module per rule family, feature or
scenario group, in the same folder), its shared helpers in a helper module beside them (not `test_*`), as
`tests/shared/test_rules_catalogue_*.py` and `tests/shared/catalogue_helpers.py` were."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("producer", "workers", "shared", "redisio", "kubeio", "ipamgc", "lab")
TESTS = "tests"
MAX_LINES = 400


def modules(*roots: str) -> list[Path]:
    return sorted(p for root in roots or PACKAGES for p in (ROOT / root).rglob("*.py"))


def test_the_packages_hold_modules() -> None:
    assert len(modules()) > 100  # the walk found the code it checks
    assert len(modules(TESTS)) > 100  # and the tests


@pytest.mark.parametrize("package", (*PACKAGES, TESTS))
def test_no_module_is_past_400_lines(package: str) -> None:
    over = {
        str(p.relative_to(ROOT)): n
        for p in modules(package)
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert over == {}, f"split these along what they own: {over}"
