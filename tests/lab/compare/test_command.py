"""`ipamgc compare`'s bad input: one line on stderr, exit 2, before anything is started."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from ipamgc.cli import cli
from lab.kubecontrollers import ENV_VAR


def _run(args: list[str], env: dict[str, str | None] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["compare", *args], env={ENV_VAR: None, **(env or {})})
    return result.exit_code, result.stdout, result.stderr


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture
def binary(tmp_path: Path) -> Path:
    path = tmp_path / "kube-controllers"
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


def test_without_a_binary_it_says_how_to_get_one(tmp_path: Path) -> None:
    code, out, err = _run(["--generate", "1"])
    assert (code, out) == (2, "")
    line = _one_line(err)
    assert "--calico-kube-controllers" in line and ENV_VAR in line and "calico/kube-controllers" in line


def test_a_binary_that_is_not_there_or_not_executable(tmp_path: Path) -> None:
    code, _, err = _run(["--generate", "1", "--calico-kube-controllers", str(tmp_path / "nope")])
    assert code == 2 and "no such file" in _one_line(err)
    plain = tmp_path / "plain"
    plain.write_text("")
    code, _, err = _run(["--generate", "1"], env={ENV_VAR: str(plain)})
    assert code == 2 and "not executable" in _one_line(err)


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"{not json", "cannot read the snapshot"),
        (b'{"kind": "Pod"}', "not a Kubernetes List"),
        (b"[]", "not a Kubernetes List"),
    ],
)
def test_a_bad_snapshot(tmp_path: Path, binary: Path, content: bytes, says: str) -> None:
    snap = tmp_path / "snap.json"
    snap.write_bytes(content)
    code, out, err = _run(["--snapshot", str(snap), "--calico-kube-controllers", str(binary)])
    assert (code, out) == (2, "")
    assert says in _one_line(err)


def test_a_missing_snapshot_file(tmp_path: Path, binary: Path) -> None:
    code, _, err = _run(
        ["--snapshot", str(tmp_path / "absent.json"), "--calico-kube-controllers", str(binary)]
    )
    assert code == 2 and "cannot read the snapshot" in _one_line(err)


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--generate", "1", "--snapshot", "x.json"],
        ["--generate", "1", "--leak-grace-period", "soon"],
        ["--generate", "1", "--leak-grace-period", "0s"],
    ],
    ids=["neither", "both", "bad-grace", "zero-grace"],
)
def test_usage_errors(binary: Path, args: list[str]) -> None:
    code, out, err = _run([*args, "--calico-kube-controllers", str(binary)])
    assert (code, out) == (2, "")
    assert _one_line(err).startswith("ipamgc compare: error:")
