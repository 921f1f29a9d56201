"""`ipamgc.malloc.pin_mmap_threshold`: set on glibc, left alone when the operator set glibc's own tunable.
Checked in fresh interpreters, since it changes the allocator of the process it runs in."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

SCRIPT = "from ipamgc.malloc import pin_mmap_threshold; print(pin_mmap_threshold())"


def _run(env: dict[str, str]) -> str:
    argv = [sys.executable, "-c", SCRIPT]
    out = subprocess.run(argv, check=False, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_set_on_glibc() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")}
    assert _run(env) == "True"


def test_the_operators_setting_wins() -> None:
    assert _run({**os.environ, "MALLOC_MMAP_THRESHOLD_": "262144"}) == "False"
    assert _run({**os.environ, "GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=262144"}) == "False"
