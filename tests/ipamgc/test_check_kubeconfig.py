"""`ipamgc check --kubeconfig` with a kubeconfig that cannot work: one line on stderr and exit 2, never a
traceback (one translation, `kubeio.client`, serves the watcher through `producer.kube` and the leader)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from click.testing import CliRunner

from ipamgc.cli import cli
from shared.errors import ConfigError


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("apiVersion: v1\nclusters: [\n  bad", "cannot load Kubernetes configuration: while parsing"),
        ("clusters: 5\n", "not a kubeconfig"),
        ("- a\n- b\n", "not a kubeconfig"),
        ("hello: world\n", "Expected key current-context"),
        (None, "cannot load Kubernetes configuration"),
    ],
    ids=["bad-yaml", "wrong-type", "a-list", "no-context", "missing"],
)
def test_a_malformed_kubeconfig_is_one_line_and_exit_2(
    tmp_path: Path, content: str | None, expected: str
) -> None:
    path = tmp_path / "kubeconfig"
    if content is not None:
        path.write_text(content)
    result = CliRunner().invoke(cli, ["check", "--kubeconfig", str(path)])
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("ipamgc check: error: cannot read the cluster: ")
    assert expected in result.stderr


@pytest.mark.parametrize("module", ["kubeio.client", "producer.kube"])
def test_the_kube_edge_translates_a_malformed_kubeconfig(tmp_path: Path, module: str) -> None:
    api_client = importlib.import_module(module).api_client
    path = tmp_path / "kubeconfig"
    path.write_text("clusters: 5\n")
    with pytest.raises(ConfigError, match="not a kubeconfig"):
        api_client(str(path))
