"""promtool and helm for the tests that run them: built by .ci/deploy-checks with the go tool (exact
versions pinned there) into ~/.cache/ipamgc-tools/<tool>-<version>/.  A test that needs one is skipped when
it has not been built yet, except under .ci/deploy-checks (IPAMGC_REQUIRE_TOOLS=1), where that fails."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.deploy.conftest import ROOT

SCRIPT = ROOT / ".ci" / "deploy-checks"
_VERSION_VARS = {"promtool": "PROMETHEUS_VERSION", "helm": "HELM_VERSION"}


def pinned(name: str) -> str:
    """The exact version .ci/deploy-checks builds of `name`."""
    match = re.search(rf"^{_VERSION_VARS[name]}=(v[0-9.]+)\b", SCRIPT.read_text(), re.MULTILINE)
    assert match, f"{SCRIPT} pins {name}"
    return match.group(1)


def tool(name: str) -> str:
    """The path of `name` (IPAMGC_PROMTOOL / IPAMGC_HELM, else the cache), or skip (fail when required)."""
    given = os.environ.get(f"IPAMGC_{name.upper()}")
    cache = Path(os.environ.get("IPAMGC_TOOLS_CACHE") or Path.home() / ".cache" / "ipamgc-tools")
    path = Path(given) if given else cache / f"{name}-{pinned(name)}" / name
    if path.is_file() and os.access(path, os.X_OK):
        return str(path)
    if os.environ.get("IPAMGC_REQUIRE_TOOLS") == "1":
        pytest.fail(f"{path} is missing: .ci/deploy-checks builds it")
    pytest.skip(f"{name} not built yet ({path}): bash .ci/deploy-checks builds it")
